"""Enter an ``overlay`` sandbox's file view with the host's programs, then exec a command. Stdlib only.

Run as root on the host: ``python3 -I -S enter_view.py <holder pid> -- <command...>`` (the
launcher of ``OverlaySandbox.launch_view``). It

1. clones the host's ``/usr``, the few files of ``/etc`` programs need (fonts, the loader's
   cache, alternatives, LibreOffice's) and the font caches as detached mounts (``open_tree``), made read-only, nosuid
   and nodev (``mount_setattr``),
2. enters the sandbox's mount namespace (``setns``: its root is the sandbox's overlay, the host's
   file system is out of reach) and makes a private copy of it (``unshare``),
3. attaches the clones there (``move_mount``: the sandbox's own ``/usr`` is hidden in this copy
   only; a missing mount point is made in the sandbox's upper layer), and
4. execs the command in ``/sandbox/work``.

The sandbox's files stay its overlay: whatever the command writes lands in its upper layer (and
its disk bound). Exit 4 with a message on stderr when a step fails.
"""

import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
AT_FDCWD = -100
AT_EMPTY_PATH, AT_RECURSIVE = 0x1000, 0x8000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 16384, 1 << 18

# /var/cache/fontconfig: without the host's font caches every start rebuilds them (seconds of CPU)
HOST_PARTS = ("/usr", "/etc/fonts", "/etc/ld.so.cache", "/etc/alternatives", "/etc/libreoffice",
              "/var/cache/fontconfig")


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret, what):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def clone_readonly(path):
    fd = _check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path),
                             OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE), f"open_tree {path}")
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    _check(libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr)), f"mount_setattr {path}")
    return fd


def main():
    pid = int(sys.argv[1])
    if sys.argv[2] != "--" or len(sys.argv) < 4:
        sys.stderr.write("usage: enter_view.py <holder pid> -- <command...>\n")
        return 2
    command = sys.argv[3:]
    try:
        clones = [(path, clone_readonly(path), os.path.isdir(path)) for path in HOST_PARTS if os.path.exists(path)]
        ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        _check(libc.setns(ns, CLONE_NEWNS), "setns")
        os.close(ns)
        _check(libc.unshare(CLONE_NEWNS), "unshare")
        _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount private /")
        for path, fd, is_dir in clones:
            if is_dir:
                os.makedirs(path, exist_ok=True)
            elif not os.path.lexists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            elif os.path.islink(path):  # a link would be followed to its target: mount on a plain file
                os.unlink(path)
                open(path, "a").close()
            _check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(path), MOVE_MOUNT_F_EMPTY_PATH),
                   f"move_mount {path}")
            os.close(fd)
        os.chdir("/sandbox/work")
    except OSError as e:
        sys.stderr.write(f"enter_view: {e}\n")
        return 4
    os.execvp(command[0], command)
    return 4


if __name__ == "__main__":
    sys.exit(main())
