"""What every task suite on disk shares: one folder per task with a task.toml, unique ids, the
spelling of a task id and of a start fingerprint (``TaskId``, ``StartFingerprint``: field types of
every kind's task.toml model), and the rules for reading a suite at all.

A suite folder is untrusted input. Contract of the readers here (``inside``, ``read_bytes``,
``read_text``, ``read_toml``, ``read_tree``, ``check_folder``): nothing a suite names or holds
reaches outside the folder it belongs to, and every problem is a one-line ``UsageError`` naming
the file (and the field that named it) and the fix, never a traceback. Refused: a path field that
is absolute or leaves its folder (``..``), a symlink whose resolved target leaves its folder, is
dangling or is a loop, a link to a folder in a tree that is read, any entry that is neither a
regular file, a folder nor such a link (a FIFO, a socket, a device), a file that cannot be listed
or read, a file over its size bound, text that is not UTF-8, TOML that does not parse. A symlink
that resolves to a regular file inside its folder is read as that file.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import Task

T = TypeVar("T", bound=Task)


def _task_id(v: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", v):
        raise ValueError("must be lowercase letters, digits and dashes")
    return v


def _fingerprint(v: str) -> str:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
        raise ValueError("must look like sha256:<64 hex digits>")
    return v


TaskId = Annotated[str, AfterValidator(_task_id)]
StartFingerprint = Annotated[str, AfterValidator(_fingerprint)]


# Size bounds of what a loader reads (bytes): a task's own text files (task.toml, patches, hidden
# tests, a check script), one file of a project, a whole project, and the entries of a folder scan.
MAX_TEXT_BYTES = 1 << 20
MAX_FILE_BYTES = 8 << 20
MAX_TREE_BYTES = 64 << 20
MAX_ENTRIES = 20_000


def _shown(path: Path | str) -> str:
    """A path as an error shows it: one line whatever its name holds."""
    text = str(path)
    return repr(text) if any(c in text for c in "\n\r\t") or not text.isprintable() else text


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _real(root: Path) -> str:
    return os.path.realpath(root)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _link_target(path: Path, root: Path) -> str:
    """The real path a symlink inside ``root`` resolves to; ``UsageError`` unless it stays inside ``root``."""
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as e:
        raise UsageError(f"{_shown(path)}: a symlink that does not resolve ({e.strerror or e}); "
                         "remove it or replace it with the file") from None
    if not _within(target, _real(root)):
        raise UsageError(f"{_shown(path)}: a symlink to {_shown(target)}, outside {_shown(root)}; nothing in a task "
                         "folder may point outside it: replace the link with a copy of what it points to")
    return target


def inside(folder: Path, rel: object, where: str) -> Path:
    """The path the field value ``rel`` names in ``folder``, refused (``UsageError`` naming ``where``,
    e.g. ``"<task.toml>: field 'bug_patch'"``) unless it is a relative path whose resolved form stays
    inside ``folder``. The path may not exist (the caller says what it expected)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UsageError(f"{where}: {rel!r} is not a file name; give a path relative to {_shown(folder)}")
    if os.path.isabs(rel):
        raise UsageError(f"{where}: {rel!r} is an absolute path; give a path inside {_shown(folder)}")
    path = folder / rel
    resolved = os.path.realpath(path)
    if not _within(resolved, _real(folder)):
        raise UsageError(f"{where}: {rel!r} leads outside {_shown(folder)} (to {_shown(resolved)}); "
                         "give a path inside it")
    return path


def _open_regular(path: Path, root: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (a symlink to a file inside ``root`` is followed),
    at most ``limit`` of them; ``UsageError`` naming ``path`` otherwise."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise UsageError(f"{_shown(path)}: cannot be read ({e.strerror or e}); check that it exists and its "
                         "permissions") from None
    real = _link_target(path, root) if stat.S_ISLNK(st.st_mode) else str(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{_shown(path)}: cannot be read ({e.strerror or e}); fix its permissions") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{_shown(path)}: is a folder, not a file; name a file")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{_shown(path)}: is {_kind(st.st_mode)}, not a regular file; replace it with a file")
        if st.st_size > limit:
            raise UsageError(f"{_shown(path)}: {st.st_size} bytes, over the limit of {limit}; make it smaller")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise UsageError(f"{_shown(path)}: cannot be read ({e.strerror or e}); fix the file") from None
    finally:
        os.close(fd)
    if total > limit:
        raise UsageError(f"{_shown(path)}: over the limit of {limit} bytes; make it smaller")
    return b"".join(chunks)


def read_bytes(path: Path, root: Path, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` inside ``root`` (contract: the module's docstring)."""
    inside(root, os.path.relpath(path, root), _shown(path))
    return _open_regular(path, root, limit)


def read_text(path: Path, root: Path, limit: int = MAX_TEXT_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8; ``UsageError`` naming the file and the first bad byte otherwise."""
    data = read_bytes(path, root, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{_shown(path)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "save it as UTF-8") from None


def read_toml(spec_file: Path, root: Path) -> dict[str, Any]:
    """The table of a TOML file inside ``root`` (``read_text``'s checks, then the TOML syntax)."""
    try:
        return tomllib.loads(read_text(spec_file, root))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{_shown(spec_file)}: not valid TOML ({e}); fix the syntax") from None


def _entries(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under ``folder`` (not following links), with its lstat, in sorted order; folders
    are walked, never yielded. Refuses special files and a folder that cannot be listed; more than
    ``MAX_ENTRIES`` entries is refused."""
    stack, seen = [folder], 0
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as it:
                names = sorted(e.name for e in it)
        except OSError as e:
            raise UsageError(f"{_shown(here)}: cannot be listed ({e.strerror or e}); fix its permissions") from None
        subfolders = []
        for name in names:
            seen += 1
            if seen > MAX_ENTRIES:
                raise UsageError(f"{_shown(folder)}: holds more than {MAX_ENTRIES} entries; a task suite is small, "
                                 "remove what the tasks do not need")
            path = here / name
            try:
                st = os.lstat(path)
            except OSError as e:
                raise UsageError(f"{_shown(path)}: cannot be read ({e.strerror or e}); fix its permissions") from None
            if stat.S_ISDIR(st.st_mode):
                subfolders.append(path)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                yield path, st
            else:
                raise UsageError(f"{_shown(path)}: is {_kind(st.st_mode)}; a task suite holds only files and "
                                 "folders, remove it")
        stack.extend(reversed(subfolders))


def check_folder(folder: Path, root: Path) -> None:
    """Refuse ``folder`` if anything under it is a symlink that leaves ``root`` (``folder`` itself or
    a folder holding it) or does not resolve, or a special file (module contract)."""
    for path, st in _entries(folder):
        if stat.S_ISLNK(st.st_mode):
            _link_target(path, root)


def read_tree(folder: Path, root: Path, skip: Callable[[str], bool] = lambda _rel: False) -> dict[str, bytes]:
    """Every file under ``folder`` as ``{posix relative path: bytes}``, ``skip``ped paths left out.
    A symlink to a regular file inside ``root`` is read as that file; a symlink to a folder, and one
    leaving ``root``, are refused, as is a file over ``MAX_FILE_BYTES`` or a tree over ``MAX_TREE_BYTES``.
    The caller has checked ``folder`` itself (``inside``)."""
    out: dict[str, bytes] = {}
    total = 0
    for path, st in _entries(folder):
        rel = path.relative_to(folder).as_posix()
        if skip(rel):
            continue
        if stat.S_ISLNK(st.st_mode) and os.path.isdir(_link_target(path, root)):
            raise UsageError(f"{_shown(path)}: a symlink to a folder; replace it with the folder itself")
        out[rel] = _open_regular(path, root, MAX_FILE_BYTES)
        total += len(out[rel])
        if total > MAX_TREE_BYTES:
            raise UsageError(f"{_shown(folder)}: over {MAX_TREE_BYTES} bytes of files; a project is small, "
                             "remove what the task does not need")
    return out


def load_folders(suite: Path, load_one: Callable[[Path], T], doc: str) -> tuple[T, ...]:
    """Load every ``*/task.toml`` folder of ``suite`` with ``load_one``; sorted by id, ids unique.
    Before ``load_one`` runs, each task folder is checked (``check_folder``: no link out of it, no
    special file) and its task.toml read (``read_toml``), so every kind's loader meets only
    readable, UTF-8, parseable task.toml files in folders that point nowhere else."""
    folders = task_folders(suite, doc)
    tasks: Sequence[T] = [load_one(f) for f in folders]
    seen: dict[str, Path] = {}
    for folder, t in zip(folders, tasks, strict=True):
        if t.id in seen:
            raise UsageError(f"{folder}/task.toml: field 'id': {t.id!r} is also used by {seen[t.id]}; "
                             "ids must be unique")
        seen[t.id] = folder
    return tuple(sorted(tasks, key=lambda t: t.id))


def task_folders(suite: Path, doc: str) -> list[Path]:
    """The task folders of ``suite`` (those holding a task.toml), sorted, each checked as
    ``load_folders`` says; ``UsageError`` when there is none."""
    folders = sorted(p.parent for p in suite.glob("*/task.toml"))
    if not folders:
        raise UsageError(f"--tasks: {_shown(suite)} holds no */task.toml; see {doc}")
    for folder in folders:
        if os.path.islink(folder):
            _link_target(folder, suite)
        check_folder(folder, folder)
        read_toml(folder / "task.toml", folder)
    return folders


# the built-in suites (``coding``, ``desktop``): data, shipped in the package
BUILTIN_ROOT = Path(__file__).resolve().parents[1] / "tasks"


def suite_dir(name_or_path: str) -> Path:
    """The folder of a suite: a bare built-in name (``coding``, ``desktop``) is the built-in suite even when
    the working folder holds a folder of that name (an out folder called ``desktop`` must not shadow it);
    anything else is a folder path. Write ``./desktop`` for a folder of that name."""
    builtin = BUILTIN_ROOT / name_or_path
    if "/" not in name_or_path and not name_or_path.startswith(".") and builtin.is_dir():
        return builtin
    path = Path(name_or_path)
    if path.is_dir():
        return path
    names = sorted(p.name for p in BUILTIN_ROOT.iterdir() if p.is_dir()) if BUILTIN_ROOT.is_dir() else []
    raise UsageError(f"--tasks: {name_or_path!r} is neither a folder nor a built-in suite ({', '.join(names)})")
