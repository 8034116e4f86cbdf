"""The guest agent of the ``vm`` substrate: PID 1 of the guest, JSON lines over virtio-serial.

This file is copied into the guest's initramfs and run there by the guest's own ``python3``
(Debian's, from the shared root filesystem); it imports nothing from DrumsBench. The initramfs's
``/init`` mounts the root disk, copies this file to ``/run/drumsbench/agent.py`` and
``switch_root``s into ``python3 -u /run/drumsbench/agent.py``: the agent is the guest's init.

Protocol: one JSON object per line each way. A request has ``id`` and ``op``; its response has
the same ``id`` and ``ok`` (with ``error`` and ``errno`` when false). Binary data is base64.

- ``ping``                          -> {}
- ``hello`` {time, seed}            set CLOCK_REALTIME, mix ``seed`` into the kernel's pool and
                                    force a reseed of its CRNG (a fork's fresh randomness)
- ``exec`` {argv, cwd, env, stdin, timeout, limit}
                                    -> {code, out, err, out_total, err_total, timed_out}
- ``py`` {source, argv, ... as exec}  run Python source in a fork of the agent (digest, canary
                                    scan: no interpreter start-up, which costs ~0.3 s emulated)
- ``write`` {path, data}; ``put`` {base, files}; ``read`` {path, limit} -> {data}
- ``reset`` {dirs}                  kill every process but the agent, empty ``dirs`` and the
                                    guest's temp folders
- ``sync``                          flush the guest's file systems (before a snapshot)

Each request runs in its own thread, so execs run concurrently. As PID 1 the agent reaps every
process: one reaper thread waits for any child and hands exit statuses to the execs waiting for
them (orphans are reaped and forgotten).
"""

import base64
import contextlib
import fcntl
import hashlib  # noqa: F401 - loaded once here for the scripts ``py`` runs in forks
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import threading
import time

EXEC_VAR = "DRUMSBENCH_EXEC"
DRAIN_GRACE_S = 0.2
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207

_spawn_lock = threading.Lock()
_children = {}  # pid -> [event, status]
_have_children = threading.Condition()
_exec_seq = 0


def log(msg):
    with contextlib.suppress(OSError):
        os.write(2, (f"drumsbench-agent: {msg}\n").encode())


# -- process management -------------------------------------------------------------------------
def reaper():
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            with _have_children:
                _have_children.wait(1.0)
            continue
        except InterruptedError:
            continue
        with _spawn_lock:
            entry = _children.pop(pid, None)
            if entry is not None:
                entry[1] = status
                entry[0].set()
                with contextlib.suppress(OSError):
                    os.write(entry[2], b"x")  # wakes the exec waiting in select()


def exit_code(status):
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def procs():
    """(pid, ppid, environ bytes) of every user process but the agent."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == 1:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if pid == 2 or ppid == 2:  # kernel threads
            continue
        out.append(pid)
    return out


def marked(token):
    needle = (f"{EXEC_VAR}={token}").encode()
    found = []
    for pid in procs():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def kill(pids):
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def killpg(pgid):
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


class HeadTail:
    def __init__(self, limit):
        self.head_room = limit - limit // 2
        self.tail_room = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        take = min(len(chunk), self.head_room - len(self.head))
        if take > 0:
            self.head += chunk[:take]
            chunk = chunk[take:]
        if chunk and self.tail_room > 0:
            self.tail += chunk
            if len(self.tail) > self.tail_room:
                del self.tail[: len(self.tail) - self.tail_room]

    def value(self):
        return bytes(self.head + self.tail)


def spawn(argv, cwd, env, fds):
    """posix_spawn (vfork-like: no copy of the agent's memory) in a new session, in ``cwd``.

    The agent's own working folder is changed around the call; spawns are serialised by
    ``_spawn_lock`` and nothing else in the agent uses relative paths.
    """
    path = argv[0]
    if "/" not in path:
        found = shutil.which(path, path=env.get("PATH", os.environ["PATH"]))
        if found is None:
            raise FileNotFoundError(2, "not found")
        path = found
    actions = [(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
               (os.POSIX_SPAWN_DUP2, fds[2], 2)]
    os.chdir(cwd)
    try:
        return os.posix_spawn(path, argv, env, file_actions=actions, setsid=True)
    finally:
        os.chdir("/")


def fork_python(source, argv, cwd, fds):
    """Run ``source`` as a script in a fork of the agent: no interpreter start-up, no imports.

    The child only runs the script (which imports what the agent already has loaded) and exits.
    """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setsid()
            os.dup2(fds[0], 0)
            os.dup2(fds[1], 1)
            os.dup2(fds[2], 2)
            os.chdir(cwd)
            sys.argv = list(argv)
            exec(compile(source, "<drumsbench>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    return pid


def do_py(req):
    return do_exec(req, python=req["source"])


def do_exec(req, python=None):
    global _exec_seq
    argv = req["argv"]
    cwd = req.get("cwd") or "/"
    env = dict(req.get("env") or {})
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None
    timeout = float(req["timeout"])
    limit = int(req.get("limit", 65536))
    if not os.path.isdir(cwd):
        raise OSError(2, f"working folder {cwd} is gone")
    t0 = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if stdin is not None:
        in_r, in_w = os.pipe()
    else:
        in_r, in_w = os.open("/dev/null", os.O_RDONLY), None
    wake_r, wake_w = os.pipe()
    entry = [threading.Event(), None, wake_w]  # exited, status, wake-up pipe
    with _spawn_lock:
        _exec_seq += 1
        token = str(_exec_seq)
        env[EXEC_VAR] = token
        try:
            if python is None:
                pid = spawn(argv, cwd, env, (in_r, out_w, err_w))
            else:
                pid = fork_python(python, argv, cwd, (in_r, out_w, err_w))
        except OSError as e:  # not found / not executable: what a shell would say and exit with
            for fd in (out_w, err_w, in_r, in_w, out_r, err_r, wake_r, wake_w):
                if fd is not None:
                    os.close(fd)
            code = 127 if isinstance(e, FileNotFoundError) else 126
            msg = f"{argv[0]}: {e.strerror or e}\n".encode()
            return {"code": code, "out": "", "err": base64.b64encode(msg).decode(), "out_total": 0,
                    "err_total": len(msg), "timed_out": False, "duration": time.monotonic() - t0}
        _children[pid] = entry
    with _have_children:
        _have_children.notify_all()
    for fd in (out_w, err_w, in_r):
        os.close(fd)

    keepers = {out_r: HeadTail(limit), err_r: HeadTail(limit)}
    open_fds = [out_r, err_r]
    pending = memoryview(stdin) if stdin is not None else None
    if in_w is not None:
        fl = fcntl.fcntl(in_w, fcntl.F_GETFL)
        fcntl.fcntl(in_w, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        if not pending:
            os.close(in_w)
            in_w = None
    deadline = t0 + timeout
    timed_out = False
    exited_at = None
    try:
        while open_fds:
            now = time.monotonic()
            if now >= deadline:
                timed_out = not entry[0].is_set()
                break
            if exited_at is None and entry[0].is_set():
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_GRACE_S:
                break
            # No polling: the reaper's byte on the wake pipe says the command exited.
            wait = deadline - now if exited_at is None else min(deadline - now, DRAIN_GRACE_S)
            rfds = open_fds if exited_at is not None else [*open_fds, wake_r]
            wfds = [in_w] if in_w is not None else []
            rl, wl, _ = select.select(rfds, wfds, [], wait)
            for fd in rl:
                if fd == wake_r:
                    os.read(wake_r, 64)
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.remove(fd)
                    continue
                keepers[fd].add(chunk)
            if wl:
                try:
                    n = os.write(in_w, pending[:65536])
                    pending = pending[n:]
                except (BrokenPipeError, BlockingIOError) as e:
                    if isinstance(e, BrokenPipeError):
                        pending = pending[:0]
                if not pending:
                    os.close(in_w)
                    in_w = None
        if timed_out:
            killpg(pid)
            kill(marked(token))
        if not entry[0].wait(max(0.0, deadline - time.monotonic()) + 0.5):
            timed_out = True
            killpg(pid)
            kill(marked(token))
            entry[0].wait(5.0)
    finally:
        for fd in (out_r, err_r, in_w, wake_r):
            if fd is not None:
                os.close(fd)
        with _spawn_lock:  # the reaper writes to wake_w only under this lock
            _children.pop(pid, None)
            os.close(wake_w)
    status = entry[1]
    code = exit_code(status) if status is not None else -9
    out, err = keepers[out_r], keepers[err_r]
    return {
        "code": code,
        "out": base64.b64encode(out.value()).decode(),
        "err": base64.b64encode(err.value()).decode(),
        "out_total": out.total,
        "err_total": err.total,
        "timed_out": timed_out,
        "duration": time.monotonic() - t0,
    }


# -- files --------------------------------------------------------------------------------------
def write_file(path, data):
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def do_write(req):
    write_file(req["path"], base64.b64decode(req["data"]))
    return {}


def do_put(req):
    base = req["base"].rstrip("/")
    for rel, data in req["files"].items():
        write_file(base + "/" + rel, base64.b64decode(data))
    return {}


def do_read(req):
    limit = req.get("limit")
    with open(req["path"], "rb") as f:
        data = f.read(-1 if limit is None else int(limit))
    return {"data": base64.b64encode(data).decode()}


def empty(folder):
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        return
    for name in entries:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def rmtree(path):
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            p = os.path.join(root, name)
            try:
                if os.path.islink(p):
                    os.unlink(p)
                else:
                    os.rmdir(p)
            except FileNotFoundError:
                pass
    os.rmdir(path)


def do_reset(req):
    for _ in range(50):
        left = procs()
        if not left:
            break
        kill(left)
        time.sleep(0.02)
    else:
        raise OSError(16, f"processes survive SIGKILL: {procs()}")
    for folder in list(req.get("dirs", [])) + list(TEMP_DIRS):
        empty(folder)
    return {}


# -- clock and randomness -----------------------------------------------------------------------
def do_hello(req):
    if req.get("time") is not None:
        time.clock_settime(time.CLOCK_REALTIME, float(req["time"]))
    if req.get("seed"):
        seed = base64.b64decode(req["seed"])
        fd = os.open("/dev/urandom", os.O_WRONLY)
        try:
            os.write(fd, seed)
            try:  # credit the host's bytes and force a reseed (needs CAP_SYS_ADMIN: we are root)
                fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
                fcntl.ioctl(fd, RNDRESEEDCRNG)
            except OSError as e:
                log(f"reseed: {e}")
        finally:
            os.close(fd)
    return {"pid": os.getpid()}


def do_sync(req):
    os.sync()
    return {}


OPS = {
    "ping": lambda req: {},
    "hello": do_hello,
    "exec": do_exec,
    "py": do_py,
    "write": do_write,
    "put": do_put,
    "read": do_read,
    "reset": do_reset,
    "sync": do_sync,
}


# -- the channel --------------------------------------------------------------------------------
class Port:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.lock = threading.Lock()

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.fd, view)
                except OSError:
                    return  # the host went away; it will see the sandbox as lost
                view = view[n:]

    def lines(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:  # no host connected (before the first connect, after a snapshot)
                buf = b""
                time.sleep(0.01)
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    yield line


def handle(port, req):
    rid = req.get("id")
    try:
        fn = OPS[req["op"]]
        res = fn(req)
        res["id"] = rid
        res["ok"] = True
    except Exception as e:
        res = {"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}",
               "errno": getattr(e, "errno", None)}
    port.send(res)


def find_port(name):
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for entry in sorted(os.listdir(base)):
                with open(os.path.join(base, entry, "name")) as f:
                    if f.read().strip() == name:
                        return "/dev/" + entry
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit(f"no virtio port named {name}")


def setup_system():
    def mount(src, target, fstype, opts=""):
        os.makedirs(target, exist_ok=True)
        cmd = f"mount -t {fstype} -o {opts or 'defaults'} {src} {target}"
        if os.system(cmd + " 2>/dev/null") != 0:
            log(f"{cmd} failed")

    mount("devpts", "/dev/pts", "devpts", "gid=5,mode=620")
    mount("tmpfs", "/dev/shm", "tmpfs", "mode=1777,nosuid,nodev")
    for folder in ("/tmp", "/var/tmp"):
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o1777)
    with contextlib.suppress(OSError):
        socket.sethostname("sandbox")
    try:  # bring up loopback (there is no other network device)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ifreq = struct.pack("16sH14s", b"lo", 0x1 | 0x40, b"")  # IFF_UP | IFF_RUNNING
        fcntl.ioctl(s.fileno(), 0x8914, ifreq)  # SIOCSIFFLAGS
        s.close()
    except OSError as e:
        log(f"loopback: {e}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # children must not inherit an ignored SIGPIPE
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    os.umask(0o022)
    setup_system()
    threading.Thread(target=reaper, daemon=True).start()
    port = Port(find_port(sys.argv[1] if len(sys.argv) > 1 else "ctl"))
    log("ready")
    for line in port.lines():
        try:
            req = json.loads(line)
        except ValueError:
            port.send({"id": None, "ok": False, "error": "bad request line"})
            continue
        threading.Thread(target=handle, args=(port, req), daemon=True).start()


if __name__ == "__main__":
    main()
