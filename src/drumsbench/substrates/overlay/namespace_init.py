"""Fork server of the ``overlay`` substrate: makes namespace holders. Stdlib only.

Run as ``python -I -S namespace_init.py`` by ``overlay.OverlaySubstrate`` (one per run, started lazily),
with the run's label in its environment. It reads one JSON request per line on stdin and answers
one JSON line on stdout. A *holder* is a forked child that is pid 1 of new pid, mount, ipc, uts
and network namespaces; it mounts the sandbox's overlay, ``/proc``, a minimal ``/dev``, brings up
``lo``, pivots into the overlay (the host's root is no longer reachable in its mount namespace)
and then sleeps, reaping orphans. Commands enter it with ``nsenter``.

Nothing outlives its owner:
- the server exits when its stdin closes (the harness ended, however it ended), killing holders;
- each holder has ``PR_SET_PDEATHSIG=SIGKILL`` towards the (single-threaded) server;
- when a holder dies the kernel kills every process of its pid namespace, and the mounts, made
  only inside the holder's private mount namespace, vanish with the namespace.

Forking a holder from this warm process costs about a millisecond, where starting a Python
interpreter per sandbox would cost ten or more.

Requests: ``{"op": "spawn", "cwd": DIR, "lower": [...], "upper": U, "work": W, "merged": M,
"hostname": H}`` (paths may be relative to ``cwd``) -> ``{"pid": HOST_PID}`` or ``{"error": MSG}``;
``{"op": "ping"}`` -> ``{"ok": true}``.
"""

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)

DEVICES = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")  # = bwrap.PROC_READONLY


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s):
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype, flags, data=None):
    ret = libc.mount(_b(src), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data))
    _check(ret, f"mount {target}")


def bind_readonly(path):
    mount(path, path, None, MS_BIND | MS_REC)
    mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def lo_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        flags = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
        fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags))  # SIOCSIFFLAGS
    finally:
        s.close()


def setup_holder(req, merged):
    """In the holder (pid 1 of a new pid namespace): namespaces, mounts, pivot."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    name = os.fsencode(req.get("hostname") or "sandbox")
    _check(libc.sethostname(name, ctypes.c_size_t(len(name))), "sethostname")
    lo_up()
    lower = ":".join(req["lower"])
    opts = f"lowerdir={lower},upperdir={req['upper']},workdir={req['work']}"
    if req.get("volatile"):
        opts += ",volatile"
    mount("overlay", merged, "overlay", 0, opts)
    proc = os.path.join(merged, "proc")
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for sub in PROC_READONLY:
        p = os.path.join(proc, sub)
        if os.path.exists(p):
            bind_readonly(p)
    dev = os.path.join(merged, "dev")
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k")
    for node, major, minor in DEVICES:
        os.mknod(os.path.join(dev, node), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    for link, target in DEV_LINKS:
        os.symlink(target, os.path.join(dev, link))
    os.mkdir(os.path.join(dev, "shm"), 0o1777)
    os.mkdir(os.path.join(dev, "pts"), 0o755)
    pts_opts = "newinstance,ptmxmode=0666,mode=620"
    mount("devpts", os.path.join(dev, "pts"), "devpts", MS_NOSUID | MS_NOEXEC, pts_opts)
    # Make the overlay the root and drop the host's root from this mount namespace.
    os.chdir(merged)
    if SYS_PIVOT_ROOT is None:
        raise OSError(0, f"pivot_root: unknown architecture {os.uname().machine}")
    _check(libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT), b".", b"."), "pivot_root")
    _check(libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")


def holder(req, result_fd):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.umask(0)
    os.chdir(req["cwd"])
    merged = os.path.abspath(req["merged"])
    setup_holder(req, merged)
    os.umask(0o022)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.write(result_fd, b"ok")
    os.closerange(3, 1 << 16)
    # SIGCHLD stays ignored (inherited): orphans re-parented to this init are reaped by the kernel.
    while True:
        signal.pause()


def spawn(req, orig_pidns):
    r, w = os.pipe()
    _check(libc.unshare(CLONE_NEWPID), "unshare pid")
    try:
        pid = os.fork()
    finally:
        if os.getpid() != 1:
            _check(libc.setns(orig_pidns, CLONE_NEWPID), "setns back")
    if pid == 0:
        os.close(r)
        try:
            holder(req, w)
        except BaseException as e:  # report and die: the harness turns this into SubstrateError
            try:
                os.write(w, f"error {type(e).__name__}: {e}".encode()[:4000])
            finally:
                os._exit(1)
        os._exit(1)
    os.close(w)
    poller = select.poll()
    poller.register(r, select.POLLIN)
    ready = poller.poll(20_000)
    msg = os.read(r, 4096).decode(errors="replace") if ready else "error holder setup timed out"
    os.close(r)
    if msg == "ok":
        return {"pid": pid}
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return {"error": msg.removeprefix("error ") or "holder exited during setup"}


def main():
    orig_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # holders are reaped by the kernel
    holders = {}  # pid -> pidfd
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("op") == "spawn":
                prune(holders)
                reply = spawn(req, orig_pidns)
                if "pid" in reply:
                    with contextlib.suppress(ProcessLookupError):
                        holders[reply["pid"]] = os.pidfd_open(reply["pid"])
            elif req.get("op") == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {req.get('op')!r}"}
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    for pidfd in holders.values():
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def prune(holders):
    """Forget holders that have exited (their pidfd is readable)."""
    if not holders:
        return
    poller = select.poll()
    for pidfd in holders.values():
        poller.register(pidfd, select.POLLIN)
    dead = {fd for fd, _ in poller.poll(0)}
    for pid, pidfd in list(holders.items()):
        if pidfd in dead:
            os.close(pidfd)
            del holders[pid]


if __name__ == "__main__":
    main()
