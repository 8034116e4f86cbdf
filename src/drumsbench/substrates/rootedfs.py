"""File access from the host into a sandbox's tree that cannot be tricked by links made inside it.

A command in a sandbox can replace ``work/out.txt`` by a symlink to ``/etc/shadow``; a host-side
``open()`` of the sandbox's copy would then follow the link on the *host*. Every path here is
resolved with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` relative to a root folder, so
``..`` and absolute links stay inside that folder, exactly as the sandbox's own view resolves them
when the folder is the sandbox's root (``/proc/PID/root`` of a process in it).

Linux >= 5.6 (openat2). ``RootedFS`` is stdlib + ctypes only; ``RootedFiles`` gives a sandbox its
file methods through one.
"""

from __future__ import annotations

import abc
import ctypes
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from drumsbench.core.canary_scan import scan_tokens
from drumsbench.core.errors import SubstrateError
from drumsbench.core.fingerprint import tree_digest
from drumsbench.substrates.base import Sandbox

_SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall table merge)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def openat2(
    dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE_IN_ROOT
) -> int:
    """``openat2(2)``; raises ``OSError`` (``FileNotFoundError`` for ENOENT) like ``os.open``."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path or ".")),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def available() -> bool:
    try:
        os.close(openat2(-100, "/", os.O_PATH | os.O_DIRECTORY))  # AT_FDCWD
        return True
    except OSError:
        return False


class RootedFS:
    """Files below ``root`` (a host folder, or ``/proc/PID/root``), paths relative to it."""

    RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS

    def __init__(self, root: str) -> None:
        self.root = root

    @contextmanager
    def _rootfd(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open(self, rootfd: int, rel: str, flags: int, mode: int = 0) -> int:
        return openat2(rootfd, rel, flags, mode, self.RESOLVE)

    def _makedirs(self, rootfd: int, rel_dir: str, owner: tuple[int, int] | None = None) -> None:
        parts = [p for p in rel_dir.split("/") if p]
        for i in range(len(parts)):
            prefix = "/".join(parts[: i + 1])
            try:
                os.close(self._open(rootfd, prefix, os.O_PATH | os.O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            parent = self._open(rootfd, "/".join(parts[:i]), os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(parts[i], 0o755, dir_fd=parent)
                if owner is not None:
                    os.chown(parts[i], *owner, dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                pass
            finally:
                os.close(parent)

    def write(self, rel: str, data: bytes, owner: tuple[int, int] | None = None) -> None:
        """Write ``data`` at ``rel``, creating folders; ``owner`` (uid, gid) gets what is created
        and the file (the file by its handle, never by a path a link could redirect)."""
        with self._rootfd() as rootfd:
            self._makedirs(rootfd, os.path.dirname(rel), owner)
            fd = self._open(rootfd, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if owner is not None:
                    os.fchown(fd, *owner)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def read(self, rel: str, limit: int | None = None) -> bytes:
        """The bytes of the regular file at ``rel`` (``limit`` at most). Opened non-blocking and
        checked on the open file: a fifo, socket or device a sandbox left there is refused
        (``OSError`` EINVAL), never waited on."""
        with self._rootfd() as rootfd:
            fd = self._open(rootfd, rel, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            return f.read(-1 if limit is None else limit)

    def is_dir(self, rel: str) -> bool:
        try:
            with self._rootfd() as rootfd:
                os.close(self._open(rootfd, rel, os.O_PATH | os.O_DIRECTORY))
            return True
        except OSError:
            return False

    @contextmanager
    def plain_dir(self, rel: str) -> Iterator[str | None]:
        """A host path to folder ``rel`` when no part of ``rel`` is a link (else ``None``).

        The path is ``/proc/self/fd/N`` of an open handle, valid inside the ``with`` block, so a
        walk below it starts in the right folder even if the name is swapped meanwhile.
        """
        try:
            with self._rootfd() as rootfd:
                flags = os.O_RDONLY | os.O_DIRECTORY
                fd = openat2(rootfd, rel, flags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
                yield None
                return
            raise
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)


class RootedFiles(Sandbox):
    """The file methods of a sandbox whose files the harness reaches through a ``RootedFS``
    (``_rooted()``; ``_rel`` maps an in-sandbox path into it): no process is started, and links
    made inside the sandbox resolve as they do inside it. Digest and canary scan walk a folder on
    the host when no part of its path is a link, else run inside the sandbox."""

    @abc.abstractmethod
    def _rooted(self) -> RootedFS:
        """The sandbox's files; ``SubstrateError`` when the sandbox is gone."""

    @abc.abstractmethod
    def _rel(self, path: str) -> str:
        """``path`` (absolute, in the sandbox) relative to ``_rooted()``'s root."""

    def _file_owner(self) -> tuple[int, int] | None:
        """(uid, gid) that written files and created folders get (None: the harness's)."""
        return None

    def write_file(self, path: str, data: bytes) -> None:
        rel = self._rel(path)
        try:
            self._rooted().write(rel, data, owner=self._file_owner())
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot write {path}: {e}") from e

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        rel = self._rel(path)
        try:
            return self._rooted().read(rel, limit)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise self._read_failed(path, e) from e

    def _read_failed(self, path: str, e: OSError) -> Exception:
        return SubstrateError(f"sandbox {self.id}: cannot read {path}: {e}")

    def tree_digest(self, path: str) -> str:
        with self._rooted().plain_dir(self._rel(path)) as host:
            if host is not None:
                return tree_digest(host)
        return Sandbox.tree_digest(self, path)

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        hits: set[str] = set()
        fs = self._rooted()
        for folder in folders:
            with fs.plain_dir(self._rel(folder)) as host:
                if host is None:
                    hits |= Sandbox.scan(self, [folder], tokens)
                else:
                    hits |= scan_tokens([host], list(tokens))
        return hits
