"""State fingerprints: one digest for a folder tree, identical on the host and inside a sandbox.

Contract: ``tree_digest(root)`` walks ``root`` in sorted order and hashes, for every regular file,
its path relative to ``root`` and the SHA-256 of its bytes; for every symlink, its path and target;
for every empty directory, its path. File modes and times are ignored (they differ between
substrates for the same content). The result is ``"sha256:<hex>"``.

The same function is shipped into sandboxes as source (``DIGEST_SCRIPT``) so that substrates
without host-side file access compute the identical value with one ``python3`` call.
"""

from __future__ import annotations

import hashlib
import inspect
import os


def tree_digest(root: str) -> str:
    """Digest of the tree under ``root``; a missing ``root`` digests as an empty tree."""
    h = hashlib.sha256()
    if os.path.isdir(root):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            if not dirnames and not filenames and rel_dir != ".":
                h.update(b"D " + rel_dir.encode("utf-8", "surrogateescape") + b"\n")
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            for name in sorted([*filenames, *links]):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
                if os.path.islink(path):
                    h.update(b"L " + rel + b" " + os.readlink(path).encode("utf-8", "surrogateescape") + b"\n")
                elif os.path.isfile(path):
                    fh = hashlib.sha256()
                    with open(path, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 16), b""):
                            fh.update(chunk)
                    h.update(b"F " + rel + b" " + fh.hexdigest().encode() + b"\n")
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
    "import hashlib, os, sys\n\n"
    + inspect.getsource(tree_digest)
    + "\nprint(tree_digest(sys.argv[1]))\n"
)
