"""The in-sandbox spawner (``substrates/spawner.py``): run as ``python3 -I -S -c SOURCE UID``.

It runs as the harness's uid inside the sandbox's cgroups, so every command it starts is born in
them: no command joins a cgroup (a cgroup v1 attach waits for an RCU grace period, 7-17 ms here,
whenever no attach ran in the last few ms — the first command after any pause).

Protocol, on the ``SOCK_SEQPACKET`` socket that is its stdin: it sends ``ready`` once, then reads
requests. One request is one message: JSON ``{"argv", "cwd", "env"}`` with, as ``SCM_RIGHTS``,
the reply socket and the command's stdin, stdout and stderr. It forks the command (new session;
those three descriptors as 0-2 and no other; ``chdir``, then no supplementary groups, gid and uid
UID; ``execvpe`` with the request's PATH) and answers on the reply socket ``pid N`` with a pidfd
of the command (taken before it can be reaped, so it names that process), then, when the command
has ended and is reaped, ``exit CODE`` (-N: killed by signal N). A command that cannot be executed
writes why to its stderr and exits 127 (not found) or 126, as a shell would.

Written for the interpreter's standard library only, without ``site`` (``-S``): a few imports.
"""

import array
import json
import os
import selectors
import socket
import sys


def child(argv, cwd, env, uid, fds):
    """The forked command: never returns."""
    code = 126
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        os.chdir(cwd)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        e = execvpe(argv, env)
        code = 127 if isinstance(e, FileNotFoundError) else 126
        os.write(2, f"drumsbench: cannot run {argv[0]}: {e.strerror}\n".encode(errors="replace"))
    except BaseException as e:
        try:  # noqa: SIM105
            os.write(2, f"drumsbench: cannot start {argv[0] if argv else '?'}: {e}\n".encode(errors="replace"))
        except BaseException:
            pass
    os._exit(code)


def execvpe(argv, env):
    """``os.execvpe`` without its imports (the child runs as the sandbox's uid, which may not read the
    interpreter's library): each folder of the request's PATH in turn; returns the error that
    counts (the first that is not "not found") when none could be executed."""
    name = argv[0]
    folders = [""] if "/" in name else (env.get("PATH") or "/usr/bin:/bin").split(":")
    saved = None
    last = FileNotFoundError(2, "No such file or directory")
    for folder in folders:
        try:
            os.execve(os.path.join(folder, name) if folder else name, argv, env)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            last = e
            saved = saved or e
    return saved or last


def serve(uid):
    ctl = socket.socket(fileno=0)
    ctl.send(b"ready")
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                if not receive(ctl, sel, uid):
                    return
                continue
            pid, pidfd, reply = key.data
            sel.unregister(pidfd)
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:  # noqa: SIM105 - the harness may have given up on it
                reply.send(f"exit {code}".encode())
            except OSError:
                pass
            reply.close()
            os.close(pidfd)


def receive(ctl, sel, uid):
    """Take one request and start its command; False when the harness closed the socket."""
    fds = array.array("i")
    msg, ancdata, _, _ = ctl.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if not msg:
        return False
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        return True
    reply = socket.socket(fileno=fds[0])
    std = list(fds[1:])
    try:
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            child(req["argv"], req["cwd"], req["env"], uid, std)
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError, KeyError, TypeError) as e:
        try:  # noqa: SIM105
            reply.send(f"error {e}".encode()[:4096])
        except OSError:
            pass
        reply.close()
        return True
    finally:
        for fd in std:
            os.close(fd)
    mine = os.dup(pidfd)
    try:  # noqa: SIM105 - the spawner imports as little as it can
        reply.sendmsg([f"pid {pid}".encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mine]))])
    except OSError:
        pass
    os.close(mine)
    sel.register(pidfd, selectors.EVENT_READ, (pid, pidfd, reply))
    return True


if __name__ == "__main__":
    serve(int(sys.argv[1]))
