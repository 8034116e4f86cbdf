"""State fingerprints: one digest for a folder tree, identical on the host and inside a sandbox.

Contract: ``tree_digest(root)`` walks ``root`` in sorted order and hashes, for every regular file,
its path relative to ``root`` and the SHA-256 of its bytes; for every symlink, its path and target;
for every empty directory, its path; for every other entry (a fifo, a socket, a device node), its
path and its type. File modes and times are ignored (they differ between substrates for the same
content). The result is ``"sha256:<hex>"``.

The digest never skips silently: an entry it cannot read (a folder it cannot list or enter, a file
it cannot open or stat) raises ``UnreadableEntry`` (an ``OSError``) naming the path, with the
message ``unreadable entry PATH in the start state: REASON``. Such an entry is a leftover the
digest cannot vouch for, so the caller must not take the tree as clean.

The same function is shipped into sandboxes as source (``DIGEST_SCRIPT``) so that substrates
without host-side file access compute the identical value with one ``python3`` call. The script
prints the digest and exits 0, or prints the ``UnreadableEntry`` message as the only line of its
stderr and exits ``DIGEST_UNREADABLE_EXIT`` (3); ``Sandbox.tree_digest`` turns that into a
``SubstrateError`` whose message carries the line.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import stat

DIGEST_UNREADABLE_EXIT = 3
# ``tree_digest`` of an empty folder
EMPTY_TREE = "sha256:" + hashlib.sha256().hexdigest()
UNREADABLE_MARK = "unreadable entry "


class UnreadableEntry(OSError):
    """An entry of the tree that the digest could not read; ``path`` is its path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"unreadable entry {path} in the start state: {reason}")
        self.path = path


def tree_digest(root: str, shown_root: str | None = None) -> str:
    """Digest of the tree under ``root``; a missing ``root`` digests as an empty tree.

    Raises ``UnreadableEntry`` for any entry it cannot read instead of leaving it out; its path
    starts with ``shown_root`` instead of ``root`` when given (a caller that walks a
    ``/proc/self/fd/N`` handle names the in-sandbox folder)."""

    def shown(path: str) -> str:
        return path if shown_root is None else shown_root.rstrip("/") + path[len(root.rstrip("/")):]

    def unreadable(path: str, err: OSError) -> UnreadableEntry:
        return UnreadableEntry(shown(path), err.strerror or str(err))

    def walk_error(err: OSError) -> None:
        raise unreadable(err.filename or root, err) from err

    h = hashlib.sha256()
    try:
        root_is_dir = stat.S_ISDIR(os.stat(root).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        root_is_dir = False
    except OSError as e:
        raise unreadable(root, e) from e
    if root_is_dir:
        for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            if not dirnames and not filenames and rel_dir != ".":
                h.update(b"D " + rel_dir.encode("utf-8", "surrogateescape") + b"\n")
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            for name in sorted([*filenames, *links]):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
                try:
                    st = os.lstat(path)
                    mode = st.st_mode
                    if stat.S_ISLNK(mode):
                        target = os.readlink(path).encode("utf-8", "surrogateescape")
                        h.update(b"L " + rel + b" " + target + b"\n")
                    elif stat.S_ISREG(mode):
                        fh = hashlib.sha256()
                        # O_NONBLOCK|O_NOFOLLOW: an entry swapped for a fifo or a link meanwhile
                        # cannot block the digest or lead it outside the tree.
                        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                        with open(fd, "rb") as f:
                            if not stat.S_ISREG(os.fstat(fd).st_mode):
                                raise UnreadableEntry(shown(path), "changed type while being digested")
                            for chunk in iter(lambda: f.read(1 << 16), b""):
                                fh.update(chunk)
                        h.update(b"F " + rel + b" " + fh.hexdigest().encode() + b"\n")
                    elif stat.S_ISDIR(mode):  # a folder os.walk could not tell apart: not walked
                        raise UnreadableEntry(shown(path), "a folder the walk could not enter")
                    else:
                        kind = ("fifo" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
                                else "chardev" if stat.S_ISCHR(mode) else "blockdev" if stat.S_ISBLK(mode)
                                else "other")
                        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                            kind += f":{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
                        h.update(b"O " + rel + b" " + kind.encode() + b"\n")
                except UnreadableEntry:
                    raise
                except OSError as e:
                    raise unreadable(path, e) from e
    return "sha256:" + h.hexdigest()


def files_digest(files: dict[str, bytes]) -> str:
    """Digest of an in-memory tree (relative path -> bytes), equal to ``tree_digest`` of it on disk.

    Only regular files are represented, so empty directories must not be part of a start state.
    """
    h = hashlib.sha256()
    # os.walk order: files of a directory before its subdirectories, each sorted by name.
    def walk_key(path: str) -> tuple[tuple[int, str], ...]:
        *dirs, name = path.split("/")
        return (*((1, d) for d in dirs), (0, name))

    for rel in sorted(files, key=walk_key):
        fh = hashlib.sha256(files[rel]).hexdigest()
        h.update(b"F " + rel.encode("utf-8", "surrogateescape") + b" " + fh.encode() + b"\n")
    return "sha256:" + h.hexdigest()


DIGEST_SCRIPT = (
    "import hashlib, os, stat, sys\n\n"
    + inspect.getsource(UnreadableEntry)
    + "\n\n"
    + inspect.getsource(tree_digest)
    + "\n\ntry:\n    print(tree_digest(sys.argv[1]))\n"
    + "except UnreadableEntry as e:\n"
    + "    sys.stderr.write(str(e).replace('\\n', ' ') + '\\n')\n"
    + f"    sys.exit({DIGEST_UNREADABLE_EXIT})\n"
)
