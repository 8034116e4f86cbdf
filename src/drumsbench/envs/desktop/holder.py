"""The holder: first process (pid 1) of a desktop instance's own pid, ipc, uts, net and mount namespaces.

Started by ``unshare --fork --pid --ipc --uts --net --mount --mount-proc`` with its stdio on
/dev/null and one JSON argument. Standard library only (it runs under the system's Python, outside
the harness's virtualenv). It

1. becomes a session leader and a child subreaper (as pid 1 it reaps every orphan of the
   instance: no zombie ever lingers inside),
2. sets the instance's host name (lock files name it; one fixed name keeps forks faithful),
   brings the loopback up (UNO listens on 127.0.0.1 inside),
3. bind-mounts the sandbox's private folders over the shared ones (``/tmp/.X11-unix``,
   ``/var/lib/xkb``), so the X socket lives in the sandbox and display numbers never collide, and
   with ``writable_only`` (a container) makes its root mount read-only but for those paths,
   then drops what the launcher gave for that (``drop_admin``) and, in a container, every
   capability its own commands lack (``keep_caps``, with no_new_privs),
4. starts ``Xvfb -r -noreset -nolock -s 0`` (no key autorepeat, no screen-saver timer) and waits until it
   answers the X handshake, then ``openbox`` (with the harness's ``--config-file``, ``wm_rc``) whose
   ``--startup`` command starts the application once the window manager manages windows,
5. waits, reaping children, until Xvfb dies or it gets SIGTERM; then it exits, and the kernel
   kills every other process of the namespace.

Exit codes: 0 stopped, 3 Xvfb did not come up, 4 setup failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
MS_BIND = 4096
MS_RDONLY, MS_REMOUNT = 1, 32
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# instance.SHARED_WRITABLE (this file runs alone, under the system's Python)
SHARED_WRITABLE = ("/var/tmp", "/dev/shm", "/run/lock")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def bind(src: str, dst: str, flags: int = 0) -> None:
    libc = _libc()
    if libc.mount(src.encode(), dst.encode(), None, MS_BIND | flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bind {src} -> {dst}: {os.strerror(err)}")


def x_answers(path: str, timeout: float = 0.5) -> bool:
    """True when an X server accepts a connection on ``path`` and completes the setup handshake."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"l\0\x0b\0\0\0\0\0\0\0\0\0")  # little-endian, protocol 11.0, no authorisation
            head = s.recv(8)
            return len(head) >= 1 and head[0] == 1
    except OSError:
        return False


def main() -> int:
    cfg = json.loads(sys.argv[1])
    with contextlib.suppress(OSError):
        os.setsid()
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        socket.sethostname(cfg["hostname"])
        loopback_up()
        writable = cfg.get("writable_only")
        for path in writable or ():
            bind(path, path)  # a mount point of its own: stays writable when the root is made read-only
        for src, dst in cfg["binds"]:
            if dst in SHARED_WRITABLE and not os.path.isdir(dst):
                continue  # a view without that shared place has nothing there to cover
            if not os.path.isdir(dst):  # a view without it (overlay's rootfs has no /var/lib/xkb)
                os.makedirs(dst, mode=0o1777, exist_ok=True)
            bind(src, dst)
        if writable is not None:
            bind("/", "/", MS_REMOUNT | MS_RDONLY)  # this namespace's root mount only
        drop = [CAP_SYS_ADMIN, CAP_NET_ADMIN] if cfg.get("drop_admin") else []
        keep = cfg.get("keep_caps")
        if keep is not None:
            # the sandbox's own commands have this bounding set (a container's): nothing started
            # below gets more, and nothing gains privileges by executing a file
            with open("/proc/sys/kernel/cap_last_cap") as f:
                last = int(f.read())
            drop += [cap for cap in range(last + 1) if not (int(keep) >> cap) & 1]
        for cap in dict.fromkeys(drop):
            # the launcher gave these for the set-up above only: nothing started below keeps them
            if _libc().prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"cannot drop capability {cap}")
        if keep is not None and _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "cannot set no_new_privs")
    except OSError as e:
        sys.stderr.write(f"holder setup failed: {e}\n")
        return 4

    # Children keep the sandbox's labels (DRUMSBENCH_RUN / DRUMSBENCH_SANDBOX) so reset, destroy and
    # gc find every process of the instance.
    env = {k: v for k, v in os.environ.items() if k.startswith("DRUMSBENCH_")}
    env.update(cfg["env"])
    display = int(cfg["display"])
    env["DISPLAY"] = f":{display}"
    devnull = subprocess.DEVNULL
    # SIGTERM/SIGINT: leave at once; as pid 1 our exit makes the kernel end the whole namespace.
    signal.signal(signal.SIGTERM, lambda _s, _f: os._exit(0))
    signal.signal(signal.SIGINT, lambda _s, _f: os._exit(0))

    # Only root reaches the X server: no abstract socket (``-nolisten local``: it has no file mode and
    # the policy's shell shares this network namespace) and the path socket made 0700 below, so a
    # policy's shell action (the sandbox's uid) cannot blank, freeze or drive the screen itself.
    # ``-r``: no key autorepeat (under load xdotool's release may come more than the 660 ms repeat
    # delay after its press: typed text then got a doubled letter, "counnt")
    # ``-s 0``: no screen-saver timer (an idle episode longer than ten minutes would go black; the
    # saver's state is the evidence of a blank screen the harness did not cause — saver.py)
    xvfb = subprocess.Popen(["Xvfb", f":{display}", "-r", "-noreset", "-nolock", "-s", "0", "-nolisten", "tcp",
                             "-nolisten", "local", "-screen", "0", cfg["screen"], *cfg.get("xvfb_args", [])],
                            env=env, stdin=devnull, stdout=devnull, stderr=devnull)
    deadline = time.monotonic() + float(cfg.get("x_timeout", 10.0))
    sock = f"/tmp/.X11-unix/X{display}"
    while not x_answers(sock):
        if xvfb.poll() is not None or time.monotonic() > deadline:
            xvfb.kill()
            return 3
        time.sleep(0.01)
    os.chmod(sock, 0o700)
    as_user = list(cfg.get("as_user") or [])
    if cfg.get("x_owner") is not None:
        os.chown(sock, int(cfg["x_owner"]), -1)  # the applications' uid reaches it, no other

    # wm_first: openbox (already as_user) starts the application; else the holder does, as_user
    app = [*([] if cfg.get("wm_first", True) else as_user), *(cfg.get("app") or ["true"])]
    if cfg.get("app_exit_file"):
        # a shell waits for the application and writes its exit status: 0 when the user (the
        # policy) closed it, anything else when it crashed or was killed. The file is made anew
        # (noclobber: O_EXCL, no link followed): one the policy's shell put there first goes, and
        # the status file is root's or the applications' uid's, never the policy's commands' uid
        # (the harness takes no other as evidence)
        app = ["/bin/sh", "-c", '"$@"; s=$?; rm -f "$0"; set -C; echo $s > "$0"', cfg["app_exit_file"], *app]
    # wm_rc: the harness's configuration file (kiosk.py: no bindings, no title-bar buttons), else openbox's own
    wm = [*as_user, "openbox", *(["--config-file", cfg["wm_rc"]] if cfg.get("wm_rc") else [])]
    if cfg.get("wm_first", True):
        # the application starts once openbox manages windows (openbox runs --startup then)
        subprocess.Popen([*wm, "--startup", shlex.join(app)], env=env, stdin=devnull, stdout=devnull,
                         stderr=devnull)
    else:
        # both at once: openbox is up long before LibreOffice maps its first window
        subprocess.Popen(wm, env=env, stdin=devnull, stdout=devnull, stderr=devnull)
        subprocess.Popen(app, env=env, stdin=devnull, stdout=devnull, stderr=devnull)
    while True:
        try:
            pid, _status = os.wait()  # reaps our children and every orphan of the instance
        except ChildProcessError:
            return 0
        if pid == xvfb.pid:
            return 0  # the display is gone: end the instance (the kernel kills the rest)

if __name__ == "__main__":
    sys.exit(main())
