"""What travels from the agent's sandbox into the verifier's: the task's carried paths, checked on the host.

Contract of ``clean_archive(data, carry)``: ``data`` is a tar the agent's sandbox produced (its own
``tar``, which the agent may have replaced: nothing in it is trusted); the result is a new tar that
holds only regular files, folders and symbolic links at or below the ``carry`` paths (absolute,
stored relative to ``/``), each file's mode cut to its permission bits (no set-uid, set-gid or
sticky bit), a hard link turned into a copy of what it names. ``CarryRefused`` (the agent's doing:
the attempt fails with its reason) when the archive cannot be read, names a path outside the carried
ones or with ``..``, or writes through a link it made itself (``a`` a link, then ``a/b``): extracted
by the verifier sandbox's own ``tar``, the result cannot reach outside the carried paths. Devices,
fifos and sockets are left out.

``STEERING`` names the files that steer a test runner; ``steering_argv(folders)`` is the command
that prints, as JSON, the sha256 of every such file under ``folders``, run by a pristine
``python3`` without ``site``: the start image's reference sandbox's, and the verifier sandbox's
after the carry.
"""

from __future__ import annotations

import io
import posixpath
import tarfile

CARRY_LIMIT = 256 * 1024 * 1024  # bytes of the agent's carried files, archived
# Files that steer the test runner rather than being tested: new or changed in a carried path, they
# end the attempt failed (Harbor's tests run pytest in the working folder). A name matches a file's
# name, its extension (``.pth``) or a folder on its path (a shadowing ``_pytest/`` package).
STEERING = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
            "usercustomize.py", ".pth", "pytest.py", "py.py", "_pytest", "pytest", "pluggy")
STEERING_SCRIPT = """\
import hashlib, json, os, sys
names = set(sys.argv[2].split(","))
out = {}
for top in sys.argv[1].split(","):
    for root, dirs, files in os.walk(top):
        inside = any(part in names for part in os.path.relpath(root, top).split(os.sep))
        for f in files:
            if inside or f in names or os.path.splitext(f)[1] in names:
                p = os.path.join(root, f)
                try:
                    with open(p, "rb") as fh:
                        out[p] = hashlib.sha256(fh.read()).hexdigest()
                except OSError as e:
                    out[p] = "unreadable: " + e.strerror
print(json.dumps(out, sort_keys=True))
"""


class CarryRefused(Exception):
    """The carried archive is not one the verifier takes (module contract)."""


def steering_argv(folders: tuple[str, ...]) -> list[str]:
    return ["python3", "-I", "-S", "-c", STEERING_SCRIPT, ",".join(folders), ",".join(STEERING)]


def _inside(name: str, tops: tuple[str, ...]) -> bool:
    return any(name == t or name.startswith(t + "/") for t in tops)


def _read(data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Every member of ``data`` with a regular file's bytes (``CarryRefused`` when unreadable)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src:
            out = []
            for m in src:
                f = src.extractfile(m) if m.isfile() else None
                out.append((m, f.read() if f is not None else b""))
            return out
    except tarfile.TarError as e:
        raise CarryRefused(f"the carried files are not a readable archive ({e})") from None


def clean_archive(data: bytes, carry: tuple[str, ...]) -> bytes:
    """The checked archive (module contract)."""
    tops = tuple(p.strip("/") for p in carry)
    links: set[str] = set()
    regular: dict[str, bytes] = {}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as dst:
        for m, body in _read(data):
            raw = m.name.lstrip("/").removeprefix("./")
            name = posixpath.normpath(raw) if raw else ""
            if not name or name == "." or ".." in name.split("/") or not _inside(name, tops):
                raise CarryRefused(f"the carried files name {m.name!r}, outside {', '.join(carry)}")
            parents = name.split("/")
            if any("/".join(parents[:i]) in links for i in range(1, len(parents))):
                raise CarryRefused(f"the carried files write {name!r} through a link they hold")
            info = tarfile.TarInfo(name)
            info.uid, info.gid, info.mtime = m.uid, m.gid, m.mtime
            info.mode = m.mode & 0o777
            if m.isdir():
                info.type = tarfile.DIRTYPE
                dst.addfile(info)
            elif m.issym():
                info.type, info.linkname = tarfile.SYMTYPE, m.linkname
                links.add(name)
                dst.addfile(info)
            elif m.isfile() or m.islnk():
                if m.islnk():
                    target = posixpath.normpath(m.linkname.lstrip("/").removeprefix("./"))
                    if target not in regular:
                        raise CarryRefused(f"the carried hard link {name!r} names {m.linkname!r}, no file before it")
                    body = regular[target]
                regular[name] = body
                info.size = len(body)
                dst.addfile(info, io.BytesIO(body))
    return out.getvalue()
