"""Live restore of a checkpointed desktop instance (CRIU): the mechanics shared by the desktop's
reset by restore (``DesktopEnv.reset_by_restore``) and the ``criu`` fork method
(``branching/desktop_criu.py``).

An instance started *checkpointable* (``Settings.checkpointable``) is dumped with ``criu dump
--leave-stopped`` while its sandbox folder is copied (``core/criu.checkpoint``: files and memory of
one instant). ``restore_tree`` brings one copy of it back to life in another sandbox:

- the sandbox's folder gets a copy of the frozen folder (``cp -a``; files owned by the origin
  sandbox's uid are handed to this sandbox's uid, so its policy may write them as before);
- ``criu restore --restore-detached`` runs in a private mount namespace where that copy shows at
  the origin's exact path (lock files, profile URLs and open files all name the same paths), with
  private folders over ``/tmp`` (the X socket and LibreOffice's pipes are recreated there, never
  over the host's) and ``/var/lib/xkb``, every other mount but /proc read-only and the host's
  non-system folders covered (the restored processes have root's uid on the host, LibreOffice
  without capabilities: ``READ_ONLY_HOST``, ``cover_steps``, ``instance.CHECKPOINT_CONFINE``);
- the harness reaches X through ``/proc/<pid>/root/tmp/.X11-unix`` and runs its clients with
  nsenter (``DesktopInstance.adopt_restored``).

The origin's folder path must exist when a copy is restored: when the origin sandbox is gone, an
empty placeholder folder stands at its path (in the run's sandbox folder, removed with the run).

``StartImages``: one verified start checkpoint per (run folder, task, screen), made once and
shared by every environment of the process; its folder ``restore-<task>-<hash>`` lies in the run's
sandbox folder, so it goes with the run (substrate ``close``) and with a dead run (``drumsbench gc``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from drumsbench.core import criu
from drumsbench.core.answer_keys import SYSTEM_FOLDERS, harness_places
from drumsbench.core.errors import SubstrateError
from drumsbench.envs.desktop.instance import Settings
from drumsbench.substrates.base import APP_UID_OFFSET, SANDBOX_FOLDERS, HostFolders, HostLaunching, Sandbox


@dataclass
class Timings:
    """Where a restore's time went (seconds)."""

    copy_s: float = 0.0
    restore_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def copy_frozen(frozen: Path, root: Path, origin_uid: int | None, uid: int | None) -> None:
    """The frozen folder's contents into ``root``; what the origin sandbox's uid, its second
    (applications') uid or its gid (the same number as its uid) owned, this sandbox's own do: the
    folders' group decides whether this sandbox's applications may write them (0770)."""
    subprocess.run(["cp", "-a", f"{frozen}/.", str(root)], check=True, capture_output=True, timeout=120)
    if origin_uid is None or uid is None or origin_uid == uid:
        return
    uids = {origin_uid: uid, origin_uid + APP_UID_OFFSET: uid + APP_UID_OFFSET}
    paths = [str(root)] + [os.path.join(top, n) for top, dirs, files in os.walk(root) for n in (*dirs, *files)]
    for path in paths:
        st = os.lstat(path)
        if st.st_uid in uids or st.st_gid == origin_uid:
            os.chown(path, uids.get(st.st_uid, st.st_uid), uid if st.st_gid == origin_uid else st.st_gid,
                     follow_symlinks=False)


class ScreenMismatch(SubstrateError):
    """A restored instance does not show its checkpoint's screen (the image itself may be sound)."""


RESTORE_TIMEOUT_S = 60.0  # a restore takes about a second on a loaded 2-core host


# Every mount of the restore's private namespace but /proc made read-only (``mount -o
# remount,bind,ro``: the mount, not its file system), before the binds below are made and made
# writable again: the restored instance runs with root's uid on the host (CRIU restores the uid it had), and
# a GUI Save As must not reach the host's files. /proc stays (CRIU restores through it); device files
# stay usable on a read-only mount. A mount whose folder is gone (another sandbox's, removed on the
# host while the namespace was copied) is out of reach and skipped; any other failure fails the
# restore (the reset then starts cold, recorded). Run by bash (its printf decodes findmnt's \xHH).
READ_ONLY_HOST = (
    "findmnt -rn -o TARGET | while read -r m; do case \"$m\" in /proc|/proc/*) continue;; esac; "
    "p=$(printf '%b' \"$m\"); mount -o remount,bind,ro \"$p\" || [ ! -e \"$p\" ] || exit 1; done")


def cover_steps(keep: list[Path]) -> list[str]:
    """Shell steps that cover each top-level host folder that is not the system's
    (``answer_keys.SYSTEM_FOLDERS``: ``/work``, ``/root``, ``/home``, ``/opt``, ...) and each of the
    harness's places (``answer_keys.harness_places``: the package with its built-in suites, its
    checkout) with an empty read-only tmpfs of mode 0: a restored LibreOffice is root, so the modes of
    what lies there would not keep its Open dialog out (an answer key among them). A place that
    holds a path of ``keep`` (what the restore needs: the sandbox's copy, the images, CRIU itself)
    stays in sight; one inside a covered folder needs no cover of its own."""
    kept = [Path(os.path.realpath(k)) for k in keep]
    tops = sorted(Path("/", e.name) for e in os.scandir("/")
                  if e.is_dir(follow_symlinks=False) and e.name not in SYSTEM_FOLDERS)
    covered: list[Path] = []
    for place in (*tops, *harness_places()):
        if any(k == place or place in k.parents for k in kept):
            continue
        if any(c == place or c in place.parents for c in covered):
            continue
        covered.append(place)
    return [f"mount -t tmpfs -o ro,mode=0,size=4k drumsbench-cover {shlex.quote(str(c))}" for c in covered]


def writable_bind(src: str, dst: str, options: str = "") -> str:
    """The shell step that binds ``src`` (quoted) at ``dst`` writable (a bind keeps its source
    mount's read-only flag: it is remounted read-write on its own)."""
    return f"mount {options}--bind {src} {dst} && mount -o remount,bind,rw {dst}"


def restore_tree(images: Path, origin_root: str, root: Path, sid: str, cpu: dict[str, float] | None = None,
                 read_only_host: bool = True) -> int:
    """``criu restore`` of ``images`` in a private mount namespace where ``root`` (this sandbox's
    copy) shows at ``origin_root``, the images folder, the private /tmp and xkb folders writable and
    every other mount but /proc read-only (``READ_ONLY_HOST``) and the host's non-system folders and
    the harness's places covered (``cover_steps``); ``read_only_host=False``: the host's mounts as
    they are, for a positive control; returns the restored holder's host pid
    (pid 1 of its namespaces). ``cpu`` receives the CPU seconds the restore took (``criu_cpu_s``,
    ``tree_cpu_s``)."""
    tmp, xkb = root / ".criu-tmp", root / ".criu-xkb"
    shutil.rmtree(tmp, ignore_errors=True)  # what an earlier restore in this sandbox left (its instance is dead)
    (tmp / ".X11-unix").mkdir(parents=True, exist_ok=True)
    xkb.mkdir(exist_ok=True)
    for d in (tmp, tmp / ".X11-unix", xkb):
        d.chmod(0o1777)
    q = shlex.quote
    pidfile = images / f"pid-{sid}"
    pidfile.unlink(missing_ok=True)
    log = f"restore-{sid}.log"
    steps = []
    if read_only_host:
        steps += [*cover_steps([root, Path(origin_root), images, Path(criu.criu_bin())]), READ_ONLY_HOST]
    steps += [writable_bind(q(str(images)), q(str(images))),
              f"cd {q(str(images))}", "exec 3<.",  # the images stay reachable once /tmp is covered
              writable_bind(q(str(root)), q(origin_root)),
              writable_bind(q(str(xkb)), "/var/lib/xkb"),
              f"cd {q(str(root))}",  # so does the copy: the working folder keeps it
              writable_bind(q(str(tmp)), "/tmp")]
    if origin_root.startswith("/tmp/"):  # the origin's path again, inside the private /tmp
        steps += [f"mkdir -p {q(origin_root)}", writable_bind(".", q(origin_root), "--no-canonicalize ")]
    steps += ["cd /proc/self/fd/3", "exec 3<&-",
              f"exec {q(criu.criu_bin())} restore -D . --restore-detached --file-locks "
              f"--pidfile {q(pidfile.name)} -o {q(log)} -v2"]
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", " && ".join(steps)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    timer = threading.Timer(RESTORE_TIMEOUT_S, _kill_tree, (proc.pid,))
    timer.start()
    try:
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")  # EOF when criu exits (restored fds are the images')
        _pid, status, usage = os.wait4(proc.pid, 0)  # its CPU time, which subprocess would not tell
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
    finally:
        timer.cancel()
    try:
        if code == -signal.SIGKILL and not pidfile.exists():
            raise SubstrateError(f"criu restore did not finish within {RESTORE_TIMEOUT_S:g} s")
        if code != 0 or not pidfile.exists():
            why = criu.log_errors(images / log) or err.strip()[-300:]
            raise SubstrateError(f"criu restore failed: {why}")
        pid = int(pidfile.read_text().strip())
    finally:
        pidfile.unlink(missing_ok=True)
        if code == 0:
            (images / log).unlink(missing_ok=True)  # one log per restore would pile up over a run
    if cpu is not None:  # CRIU's own CPU and what the restored tasks spent restoring themselves
        cpu["criu_cpu_s"] = usage.ru_utime + usage.ru_stime
        cpu["tree_cpu_s"] = tree_cpu_s(pid)
    return pid


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it: a hung ``criu restore`` has forked the tasks it
    was restoring (found spinning an hour after a restore of damaged pages was given up)."""
    for p in reversed(criu.tree_pids(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def running(pid: int) -> bool:
    """Is ``pid`` alive (not gone, not a zombie)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the tree rooted at ``pid``: right after a restore, what its
    tasks spent restoring their own memory (a restored task's counters start at zero)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in criu.tree_pids(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


@dataclass
class StartImage:
    """A task's verified start state, checkpointed: ``images`` (CRIU), ``frozen`` (the origin
    sandbox's folder at the dump), where the origin lived, its display and the still frame it
    showed (a restored screen must match it)."""

    folder: Path
    origin_root: str
    origin_uid: int | None
    display: int
    settings: Settings
    frame: np.ndarray
    title: str
    made_s: float
    dump_s: float
    restores: int = 0
    document_uid: str | None = None  # the RuntimeUID of the task's document in the dumped process
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def images(self) -> Path:
        return self.folder / "images"

    @property
    def frozen(self) -> Path:
        return self.folder / "frozen"

    def usable(self) -> bool:
        return (self.images / "inventory.img").exists() and self.frozen.is_dir()


class StartImages:
    """Start checkpoints of this process, one per (run folder, task, screen), each made once
    (concurrent callers for the same key wait for the first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str, str], threading.Lock] = {}
        self._images: dict[tuple[str, str, str], StartImage] = {}

    @staticmethod
    def key(box: Sandbox, task_id: str, settings: Settings) -> tuple[str, str, str]:
        if not isinstance(box, HostFolders):
            raise SubstrateError(f"desktop: reset by restore needs host folders; {box.substrate} has none")
        return str(Path(box.host_root).parent), task_id, f"{settings.width}x{settings.height}"

    def get(self, key: tuple[str, str, str], make: Callable[[Path], StartImage]) -> StartImage:
        """The image for ``key``, made by ``make(folder)`` when there is none (or its folder went)."""
        with self._lock:
            key_lock = self._keys.setdefault(key, threading.Lock())
        with key_lock:
            image = self._images.get(key)
            if image is not None and image.usable():
                return image
            tag = hashlib.sha256("/".join(key).encode()).hexdigest()[:8]
            folder = Path(key[0]) / f"restore-{key[1]}-{tag}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                image = make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self._images[key] = image
            return image

    def forget(self, key: tuple[str, str, str]) -> None:
        """Drop an image that failed to restore (the next reset makes it again)."""
        with self._lock:
            image = self._images.pop(key, None)
        if image is not None:
            shutil.rmtree(image.folder, ignore_errors=True)


IMAGES = StartImages()


def keep_path(path: str) -> None:
    """An empty folder at ``path`` (the origin sandbox's, once it is destroyed): restores bind a
    copy over it. It holds empty, read-only sandbox folders too: ``nsenter --wd`` opens its folder
    on the host's side of the mount namespace (``DesktopInstance.exec_inside`` names the work
    folder as the instance sees it), so that path must exist on the host, and show nothing."""
    for sub in ("", *SANDBOX_FOLDERS):
        folder = Path(path) / sub
        with contextlib.suppress(FileExistsError):
            folder.mkdir(parents=True)
        folder.chmod(0o555)


def origin_uid(box: Sandbox) -> int | None:
    return box.uid if isinstance(box, HostLaunching) else None
