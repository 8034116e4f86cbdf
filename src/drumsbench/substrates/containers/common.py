"""What the container substrates (``docker``, ``podman``) share.

Both run the same image: the Debian rootfs of ``drumsbench.images`` (imported under
``images.rootfs_tag()``) plus one small layer, the **sandbox image** (``sandbox_tag()``), that
adds the folders ``/sandbox/{work,home,tmp,verify}``. A sandbox is one container of it:

- pid 1 is ``REAPER``, a few lines of Python that reap orphans and nothing else. A process inside
  the container cannot signal pid 1 (it has no handlers), so ``kill -9 -1`` from a command kills
  every process but pid 1 and the caller: that is the in-place reset (``RESET_SCRIPT``).
- every command runs with ``DRUMSBENCH_EXEC=<token>`` in its environment, and each container
  exec is its own session. On timeout ``ContainerSandbox.kill_exec`` kills, from the host, every
  process carrying the token and every process in the sessions the command's processes lead, then
  the exec ends.
- the gates never run a program of the container (its root may replace any): processes are ended
  and files digested and scanned from the host (``from_host``).
- no network (``--network none``), a pids limit and a memory limit, labels
  ``drumsbench.run=<run id>`` and ``drumsbench.sandbox=<sandbox id>``.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import io
import os
import posixpath
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

from drumsbench import images
from drumsbench.core.canary_scan import SCAN_SCRIPT, scan_hits, scan_request
from drumsbench.core.errors import SubstrateError
from drumsbench.core.fingerprint import DIGEST_SCRIPT
from drumsbench.substrates.base import (
    DEFAULT_OUTPUT_LIMIT,
    ExecRequest,
    ExecResult,
    Freezable,
    HostLaunching,
    ImageFlavors,
    ImageRecipe,
    LaunchView,
    RootCommands,
    Sandbox,
    SandboxLimits,
    SandboxPaths,
    Stream,
    Streaming,
    Substrate,
    ViewLaunching,
)
from drumsbench.substrates.containers import from_host, host_entry
from drumsbench.substrates.containers.image_layout import ImageLayout, image_layout, is_root_user
from drumsbench.substrates.exec_core import EXEC_VAR, sandbox_env
from drumsbench.substrates.hostproc import alive_not_exiting, mounts_of_source

LABEL_RUN = "drumsbench.run"
LABEL_SANDBOX = "drumsbench.sandbox"
# Name prefix of the throw-away container the sandbox image is committed from (a name, not a
# label: labels of the container would be inherited by the image and every sandbox).
BUILD_PREFIX = "drumsbench-build-"

ROOT = "/sandbox"
PATHS = SandboxPaths.under(ROOT)
FOLDERS = (PATHS.work, PATHS.home, PATHS.tmp, PATHS.verify)

# Resource limits of every sandbox container (per container, not reserved) come from the substrate's
# ``limits`` setting (``base.SandboxLimits``: 2048 pids, 4 GiB memory, 4 GiB disk by default).
QUOTA_BACKING = ("xfs",)  # backing file systems on which overlay storage takes a per-container size


def limit_mechanisms(limits: SandboxLimits, disk: str) -> dict[str, str]:
    """``Substrate.limit_mechanisms`` of a container engine; ``disk``: how the disk bound is enforced
    (or "not enforced: why")."""
    def on(value: int | None, text: str) -> str:
        return "off (setting)" if value is None else text

    return {
        "pids": on(limits.pids, f"{limits.pids}: the container's pids cgroup (--pids-limit)"),
        "memory_mb": on(limits.memory_mb, f"{limits.memory_mb} MiB: the container's memory cgroup (--memory; "
                                          "OOM kill inside it)"),
        "disk_mb": on(limits.disk_bound_mb, disk + limits.reserve_note()),
    }


def fs_type(path: Path) -> str:
    """The type of the file system holding ``path`` (longest mount point in /proc/self/mounts)."""
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as f:
            for ln in f:
                parts = ln.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                    best, kind = point, parts[2]
    except OSError:
        pass
    return kind


DISK_SOURCE = "drumsbench-disk"  # the mount table's source name of a container's disk-bound tmpfs


def disk_source(run_id: str, sid: str = "") -> str:
    """Source name of the disk tmpfs of sandbox ``sid`` of ``run_id`` (a prefix without ``sid``)."""
    return f"{DISK_SOURCE}-{run_id}-{sid}"


def bound_layer(layer: Path, size_mb: int, source: str) -> None:
    """Mount a tmpfs of ``size_mb`` MiB over a container's (not yet started) storage-layer folder
    ``layer`` (its upper and work folders), with a copy of what the folder held (the originals
    stay underneath, for the engine's own removal once the tmpfs is detached): the container's
    writes then end at ENOSPC of that tmpfs, never on the host's file system."""
    import subprocess

    from drumsbench.substrates.hostproc import mount_limited, unmount

    st = os.stat(layer)
    fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mount_limited(layer, size_mb, source=source, mode=st.st_mode & 0o7777)
        try:
            os.chown(layer, st.st_uid, st.st_gid)
            proc = subprocess.run(["cp", "-a", "--", f"/proc/self/fd/{fd}/.", str(layer)], pass_fds=(fd,),
                                  capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise SubstrateError(f"cannot copy the layer {layer} onto its disk bound: {proc.stderr.strip()[-200:]}")
        except BaseException:
            unmount(str(layer))
            raise
    finally:
        os.close(fd)


def bound_container_layer(engine: str, cid: str, upper: Path, work: Path, size_mb: int, source: str) -> Path:
    """``bound_layer`` over the folder holding a created container's ``upper`` and ``work`` layers;
    returns that folder."""
    if upper.parent != work.parent:
        raise SubstrateError(f"{engine}: upper {upper} and work {work} of {cid[:12]} are not in one folder")
    bound_layer(upper.parent, size_mb, source)
    return upper.parent


def unbind_disk(run_id: str, sid: str = "") -> None:
    """Detach the disk-bound tmpfs of sandbox ``sid`` of ``run_id`` (all of the run's without
    ``sid``): freed when the engine unmounts the container's rootfs, which then removes the original
    layer folder underneath."""
    from drumsbench.substrates.hostproc import mounts_of_source, unmount

    for point in mounts_of_source(disk_source(run_id, sid)):
        unmount(point)


def storage_quota(engine: str, driver: str, backing: str) -> str | None:
    """None when ``driver`` on ``backing`` takes a per-container size, else why not (one line)."""
    if driver.startswith("overlay") and backing.lower() in QUOTA_BACKING:
        return None
    return (f"{engine}'s {driver} storage on {backing or 'an unknown file system'} takes no per-container size: "
            "it needs xfs mounted with pquota")

# Bump when the sandbox layer (folders, reaper) changes: the tag changes, the image is rebuilt.
SANDBOX_LAYER_VERSION = 1

# pid 1 of every sandbox: reap every child (orphans are re-parented to pid 1), never exit.
# SIGCHLD is blocked so that it stays pending for sigtimedwait even though its action is default.
REAPER = """\
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        signal.sigtimedwait({signal.SIGCHLD}, 5)
    except InterruptedError:
        pass
"""
REAPER_ARGV = ["python3", "-S", "-E", "-c", REAPER]

# What the in-place reset empties (RESET_SCRIPT); anything else a container's writable layer holds
# must be as it was when the sandbox was handed over (``layer_fingerprint``), else the reset cannot
# undo it. ``LAYER_SELF_ONLY``: the folders above those places, whose own entry the overlay copies
# up (or whose times change) as the places fill and empty; what else they hold is compared.
RESET_PLACES = (*FOLDERS, "/tmp", "/var/tmp", "/dev/shm")
LAYER_SELF_ONLY = frozenset(posixpath.dirname(p) for p in RESET_PLACES) - {"/"}


def layer_fingerprint(upper: Path) -> dict[str, tuple[int, ...]]:
    """Every entry of a container's writable layer (its overlay upper folder, whiteouts of removed
    files included) outside ``RESET_PLACES``: path in the container -> (mode, uid, gid, size,
    ctime in ns, device). The ctime changes with any write or attribute change and cannot be set
    back by the container's processes."""
    out: dict[str, tuple[int, ...]] = {}
    for top, dirs, files in os.walk(upper):
        rel = "/" + os.path.relpath(top, upper) if top != str(upper) else ""
        dirs[:] = [d for d in dirs if f"{rel}/{d}" not in RESET_PLACES]
        for name in (*dirs, *files):
            inside = f"{rel}/{name}"
            if inside in LAYER_SELF_ONLY:
                continue
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            out[inside] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_ctime_ns, st.st_rdev)
    return out


def layer_changes(before: Mapping[str, tuple[int, ...]], after: Mapping[str, tuple[int, ...]]) -> list[str]:
    """What differs between two ``layer_fingerprint``s: '+path', '-path', '~path'."""
    return sorted([f"+{p}" for p in after.keys() - before.keys()] + [f"-{p}" for p in before.keys() - after.keys()]
                  + [f"~{p}" for p in before.keys() & after.keys() if before[p] != after[p]])


# In-place reset: kill everything but pid 1 (twice, for processes forked meanwhile), then empty
# the four folders and the container's shared temp folders.
RESET_SCRIPT = f"""\
kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null
rm -rf {" ".join(FOLDERS)} /tmp/* /tmp/.[!.]* /var/tmp/* /var/tmp/.[!.]* /dev/shm/* 2>/dev/null
mkdir -p {" ".join(FOLDERS)} && chmod 1777 {PATHS.tmp} && cd {PATHS.work}
"""



# read_file through a command: exit 3 when missing, 4 when a folder; $2 = byte limit or "".
READ_SCRIPT = """\
[ -e "$1" ] || exit 3
[ -d "$1" ] && exit 4
if [ -n "$2" ]; then exec head -c "$2" -- "$1"; else exec cat -- "$1"; fi
"""
READ_MISSING, READ_IS_DIR = 3, 4


def build_name(tag: str) -> str:
    return BUILD_PREFIX + tag.partition(":")[2]


def new_sandbox_id() -> str:
    return uuid.uuid4().hex[:12]


def new_token() -> str:
    return uuid.uuid4().hex


def sandbox_tag(flavor: str = "base") -> str:
    """Tag of the sandbox image of rootfs ``flavor`` (``images.FLAVORS``; ``base``:
    ``drumsbench-sandbox``, ``desktop``: ``drumsbench-desktop``): changes whenever the rootfs recipe
    or the sandbox layer does."""
    h = hashlib.sha256(f"{images.rootfs_tag(flavor)}|{SANDBOX_LAYER_VERSION}".encode()).hexdigest()[:12]
    return f"drumsbench-{'sandbox' if flavor == 'base' else flavor}:{h}"


TASK_SANDBOX_REPO = "drumsbench-task-sandbox"


def task_sandbox_tag(image: str) -> str:
    """Tag of the sandbox image of task image ``image`` (a ``build_recipe`` reference: content-addressed,
    ``drumsbench-task:<16 hex>``): changes with it and with the sandbox layer."""
    h = hashlib.sha256(f"{image}|{SANDBOX_LAYER_VERSION}|".encode() + layer_tar(everyone=True)).hexdigest()[:12]
    return f"{TASK_SANDBOX_REPO}:{h}"


def task_labels(image: str) -> dict[str, str]:
    """The labels of the sandbox image of task image ``image``."""
    return {"drumsbench.image": "task", "drumsbench.base": image}


def image_label(flavor: str) -> str:
    """The ``drumsbench.image`` label of the sandbox image of ``flavor``."""
    return "sandbox" if flavor == "base" else flavor


def exec_env(token: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    # the token last: a caller's env cannot hide a command from the killer
    return sandbox_env(PATHS, extra, pinned={EXEC_VAR: token})


def check_path(path: str) -> str:
    """A normalised absolute in-container path; refuses relative paths."""
    if not path.startswith("/"):
        raise SubstrateError(f"{path!r}: paths in a container sandbox must be absolute")
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/")


def files_tar(files: Mapping[str, bytes]) -> bytes:
    """An uncompressed tar of absolute in-container path -> bytes (members relative to /).

    It holds only files: parent folders are created by the extractor and existing ones keep their
    owner and mode.
    """
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(check_path(path).lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            info.mtime = now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


SOLUTION = "/solution"  # Harbor's oracle's folder, in a task image's sandbox layer (``layer_tar``)


def layer_tar(everyone: bool = False) -> bytes:
    """The sandbox layer: the four folders (tmp world-writable with the sticky bit). With
    ``everyone`` (a task image's, whose ``USER`` may be any uid): all four so, ``HOME`` being
    ``/sandbox/home``, and ``/solution`` too, where Harbor's oracle finds its files (Harbor uploads
    them as root; here the oracle's plan writes them as the image's user)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in (ROOT, *FOLDERS, *((SOLUTION,) if everyone else ())):
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if folder == PATHS.tmp or (everyone and folder != ROOT) else 0o755
            info.mtime = 0
            tar.addfile(info)
    return buf.getvalue()


def rootfs_tar_cached(flavor: str = "base") -> bool:
    return images.rootfs_dir(flavor).with_suffix(".tar").exists()


def ensure_rootfs_tar_verbose(engine: str, flavor: str = "base") -> Path:
    """``images.ensure_rootfs_tar(flavor)``, saying so when it has to run debootstrap."""
    if not rootfs_tar_cached(flavor):
        what = "the Debian rootfs" if flavor == "base" else f"the Debian rootfs with the {flavor}'s packages"
        progress(f"{engine}: building {what} ({'about a minute' if flavor == 'base' else 'a few minutes'}, once)")
    with build_lock("rootfs" if flavor == "base" else f"rootfs-{flavor}"):
        return images.ensure_rootfs_tar(flavor)


def progress(message: str) -> None:
    print(f"drumsbench: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def build_lock(name: str, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock between processes (and threads) building the same thing.

    With ``wait=False`` it yields ``False`` at once when someone else holds it.
    """
    folder = images.cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


SETTLE_S = 5.0  # how long a running record whose pid 1 is dead is read again before a probe gives up
SETTLE_POLL_S = 0.2


def state_evidence(engine: str, state: Mapping[str, Any]) -> str | None:
    """What a container's ``State`` (``docker inspect`` / ``podman inspect``) says against it.

    Only what a process inside cannot cause counts: a pause (the cgroup freezer is driven from the
    host; the container sees its cgroup file system read-only) and the container no longer running
    (its init, the reaper, ignores every signal sent from inside). ``OOMKilled`` on a running
    container is not evidence: the policy reaches it by outgrowing the memory limit itself.
    A container that died ``OOMKilled`` is not evidence either: the engines set it from the
    container's own memory cgroup, which only its processes fill; a command can raise
    ``/proc/1/oom_score_adj`` (no capability needed) and so get the reaper killed first. A host-wide
    OOM kill leaves ``OOMKilled`` false and counts as evidence.
    """
    if state.get("Paused"):
        return f"{engine}: the container is paused (a host-side freeze)"
    status = str(state.get("Status") or "?")
    if state.get("OOMKilled"):
        # The container's own memory cgroup hit its limit (the engine records OOMKilled from the
        # container's memcg, not from a host-wide OOM): its processes — the policy's — outgrew it,
        # even when the kernel chose the reaper (a command can raise /proc/1/oom_score_adj).
        return None
    if not state.get("Running") or status.lower() not in ("running", ""):
        detail = [f"exit code {state.get('ExitCode')}"]
        if state.get("OOMKilled"):
            detail.append("OOM-killed")
        if state.get("Error"):
            detail.append(f"error: {str(state['Error'])[:200]}")
        return f"{engine}: the container is not running (status {status}, {', '.join(detail)})"
    return None


def decode_tail(data: bytes, n: int = 300) -> str:
    return data.decode(errors="replace").strip()[-n:]


_Box = TypeVar("_Box", bound="ContainerSandbox")


class ContainerSandbox(Sandbox, Freezable, ViewLaunching, HostLaunching, Streaming, RootCommands):
    """One container of an engine. What the engines share is here: the exec token, batched file
    writes, the in-place reset by a script run inside, the end of processes, digests and canary scans
    from the host (``from_host``), the host's entry into the container (``host_entry``: a launched
    tree and launchers in its cgroups and namespaces), the shape of ``destroy`` and ``thaw``;
    subclasses drive their engine (the ``_engine_*`` methods). A stream (``open_stream``) is an exec
    of the engine with its own token, which ``Stream.close`` kills with ``kill_exec`` as a timed-out
    command's."""

    def __init__(self, sub: Substrate, cid: str, sid: str) -> None:
        self.substrate = sub.name
        self.run_id = sub.run_id
        self.id = sid
        self.container_id = cid
        self.paths = PATHS
        self._destroyed = False
        self._entry: host_entry.Entry | None = None
        self._layer: dict[str, tuple[int, ...]] | None = None  # record_layer
        self._upper: Path | None = None
        # who the sandbox's own commands run as: None, the container's user (root); or a task image's
        # USER, the container then being root's (so that ``exec_as_root`` has root's capabilities)
        self.exec_user: str | None = None

    def _check(self) -> None:
        if self._destroyed:
            raise SubstrateError(f"{self.substrate}: sandbox {self.id} is destroyed")

    @abc.abstractmethod
    def _engine_pid(self) -> int:
        """The host pid of the container's pid 1, from the engine's record (0 when not running)."""

    def entry(self) -> host_entry.Entry:
        """How the host enters the container: its pid 1, groups and capabilities (read once: a
        sandbox's container never restarts)."""
        self._check()
        if self._entry is None:
            pid = self._engine_pid()
            if pid <= 0:
                raise SubstrateError(f"{self.substrate}: sandbox {self.id}: the container is not running")
            self._entry = host_entry.Entry.of(pid)
        return self._entry

    def init_pid(self) -> int:
        """The host pid of the container's pid 1."""
        return self.entry().pid

    # -- ViewLaunching / HostLaunching (host_entry) ----------------------------------------------
    @property
    def uid(self) -> int | None:
        return None  # commands run as the container's root

    def launch_view(self) -> LaunchView:
        return host_entry.launch_view(self.entry(), ROOT)

    def exec_launcher(self, argv: Sequence[str], *, timeout: float, cwd: str | None = None,
                      env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                      output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        """A harness-made launcher as the host's root, in the container's cgroups (``host_entry``).
        ``cwd`` is a folder of the container: the launcher itself starts in the host's ``/`` and
        sets its folder once inside (``env -C``)."""
        del cwd
        return host_entry.run_launcher(self.entry(), self.run_id, self.id, argv, timeout=timeout, env=env,
                                       stdin=stdin, output_limit=output_limit)

    def _run(self, req: ExecRequest) -> ExecResult:
        self._check()
        token = new_token()
        return self._run_marked(req, token, exec_env(token, req.env), self.exec_user)

    def exec_as_root(self, argv: Sequence[str], *, timeout: float, cwd: str,
                     stdin: bytes | None = None) -> ExecResult:
        """``RootCommands``: the engine's exec as user 0 of the container (its USER otherwise)."""
        self._check()
        token = new_token()
        return self._run_marked(ExecRequest(list(argv), timeout, cwd, None, stdin), token, exec_env(token, None),
                                user="0")

    def open_stream(self, argv: Sequence[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Stream:
        self._check()
        token = new_token()
        return self._open_marked(list(argv), cwd or self.paths.work, exec_env(token, env), token, self.exec_user)

    @abc.abstractmethod
    def _open_marked(self, argv: list[str], cwd: str, env: Mapping[str, str], token: str,
                     user: str | None = None) -> Stream:
        """``open_stream`` of ``argv`` with environment ``env`` (which carries ``token``) as ``user``
        (None: the container's); closing the stream kills what carries the token (``kill_exec``)."""

    @abc.abstractmethod
    def _run_marked(self, req: ExecRequest, token: str, env: Mapping[str, str], user: str | None = None) -> ExecResult:
        """Run ``req`` with environment ``env`` (which carries ``token``) as ``user`` (None: the
        image's ``USER``); on timeout kill what carries the token (``kill_exec``)."""

    @abc.abstractmethod
    def _put(self, files: Mapping[str, bytes]) -> None:
        """Write absolute in-container path -> bytes in one go (``files_tar``)."""

    def write_file(self, path: str, data: bytes) -> None:
        self._put({path: data})

    def put_files(self, base: str, files: Mapping[str, bytes]) -> None:
        self._put({f"{base.rstrip('/')}/{rel}": data for rel, data in files.items()})

    @abc.abstractmethod
    def _upper_dir(self) -> Path:
        """The container's writable layer (overlay upper folder) on the host, from the engine's
        record; ``SubstrateError`` when the engine has none (another storage driver)."""

    def handed_over(self: _Box) -> _Box:
        """This sandbox with its writable layer recorded (``record_layer``), or destroyed."""
        try:
            self.record_layer()
        except SubstrateError:
            self.destroy()
            raise
        return self

    def record_layer(self) -> None:
        """The writable layer as handed over (``create``, a restore): what every reset must find
        again (its folder is asked of the engine once: it stays for the container's life)."""
        self._upper = self._upper_dir()
        self._layer = layer_fingerprint(self._upper)

    def reset_in_place(self) -> None:
        """``RESET_SCRIPT``, then the writable layer outside the sandbox's folders compared with the
        one handed over: a change there (``/etc``, ``/root``, ``/usr``, a file left in ``/sandbox``)
        is beyond this reset, so ``SubstrateError`` — the rollout then makes a fresh sandbox."""
        self._run_checked(["/bin/sh", "-c", RESET_SCRIPT], "in-place reset")
        if self._layer is None or self._upper is None:
            raise SubstrateError(f"{self.substrate}: sandbox {self.id}: no record of its writable layer as handed "
                                 "over: a reset in place cannot be checked")
        changed = layer_changes(self._layer, layer_fingerprint(self._upper))
        if changed:
            more = f" (+{len(changed) - 5} more)" if len(changed) > 5 else ""
            raise SubstrateError(f"{self.substrate}: sandbox {self.id}: changes outside its folders a reset in place "
                                 f"cannot undo: {', '.join(changed[:5])}{more}")

    def end_processes(self) -> None:
        """Kill every process in the container but its reaper, from the host (``from_host.end_all``:
        never a program of the container, which its root may have replaced); files stay."""
        self._check()
        try:
            from_host.end_all(self.entry())
        except SubstrateError as e:
            raise SubstrateError(f"{self.substrate}: sandbox {self.id}: {e}") from None

    def kill_exec(self, token: str) -> None:
        """Kill what one exec started (its processes carry ``token``), from the host."""
        from_host.kill_marked(self.entry(), f"{EXEC_VAR}={token}".encode())

    def _in_mounts(self, script: str, args: Sequence[str], what: str, stdin: bytes | None = None) -> str:
        """``script`` run by the harness's interpreter in the container's file view (``from_host``);
        its output, or ``SubstrateError`` naming ``what``."""
        self._check()
        res = from_host.run_in_mounts(self.entry(), script, args, timeout=120.0, stdin=stdin)
        if res.exit_code != 0 or res.timed_out:
            raise SubstrateError(f"{self.substrate}: sandbox {self.id}: {what} failed (exit {res.exit_code}): "
                                 f"{decode_tail(res.stderr)}")
        return res.stdout.decode().strip()

    def tree_digest(self, path: str) -> str:
        """``fingerprint.tree_digest`` of a folder of the container, by the harness's interpreter in its
        file view (``from_host.run_in_mounts``): a python3 the policy replaced is never run."""
        return self._in_mounts(DIGEST_SCRIPT, [path], "tree digest")

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        """``Sandbox.scan`` by the harness's interpreter in the container's file view."""
        if not tokens:
            return set()
        tokens = list(tokens)
        out = self._in_mounts(SCAN_SCRIPT, [], "canary scan", stdin=scan_request(folders, tokens))
        return scan_hits(out, tokens)

    @abc.abstractmethod
    def _inspect_state(self, wait: float) -> Mapping[str, Any] | str:
        """The engine's record of the container (its ``State``), or evidence as a sentence when the
        engine does not know the container or does not answer within ``wait`` seconds."""

    def probe(self, timeout: float = 5.0) -> str | None:
        """The engine's record of the container (``State``: paused, not running; ``state_evidence``)
        or the engine not answering. Never changes the container.

        A container stopped from the host (``docker kill``) has its processes dead before the engine
        records it: an exec ends with 137 while the record still says running. So when the record
        says running but the container's pid 1 (the record's ``Pid``) is gone, a zombie or exiting
        on the host (``hostproc.alive_not_exiting``), the record is read again for up to
        ``SETTLE_S`` seconds, and its verdict counts (a stop, or ``OOMKilled``, which is not
        evidence; a record that never catches up is not evidence either). No liveness command besides the record: it
        would run under the sandbox's own limits, which the policy can exhaust (a fork bomb), and so
        would not be evidence out of its reach."""
        if self._destroyed:
            return f"{self.substrate}: sandbox {self.id} is destroyed"
        deadline = time.monotonic() + SETTLE_S
        while True:
            state = self._inspect_state(timeout)
            if isinstance(state, str):
                return state
            evidence = state_evidence(self.substrate, state)
            pid = state.get("Pid")
            if evidence or state.get("OOMKilled") or (isinstance(pid, int) and alive_not_exiting(pid)):
                return evidence
            if time.monotonic() >= deadline:
                return None  # (the record never caught up: not evidence)
            time.sleep(SETTLE_POLL_S)

    # -- destroy and thaw: the shape is here, each engine gives its calls ------------------------
    def destroy(self) -> None:
        """Remove the container, the disk bound's tmpfs first. An engine that refuses to remove a
        paused container has it unpaused, then removed again; a container still there raises
        (``_not_removed``). Idempotent."""
        if self._destroyed:
            return
        self._destroyed = True
        unbind_disk(self.run_id, self.id)  # the disk bound's tmpfs first
        first = self._engine_remove()
        if first is None:
            return
        # A frozen container the engine would not remove: unpause it, then remove.
        last = self._engine_unpause_to_remove()
        if last is None:
            last = self._engine_remove()
        if last is not None:
            self._not_removed(first, last)

    def thaw(self) -> None:
        """``Freezable.thaw``: the engine's unpause (idempotent); nothing once destroyed."""
        if self._destroyed:
            return
        self._engine_unpause()

    @abc.abstractmethod
    def _engine_remove(self) -> BaseException | None:
        """Remove the container by force: None when it is gone (now or before), else the engine's
        failure, returned (not raised) for ``destroy`` to unpause and try again."""

    @abc.abstractmethod
    def _engine_unpause_to_remove(self) -> BaseException | None:
        """Unpause the container before ``destroy`` removes it again; the engine's refusal is no
        failure (the removal is tried all the same). A failure that makes that removal pointless
        (the engine not answering) is returned: ``destroy`` goes on to ``_not_removed``."""

    def _not_removed(self, first: BaseException, last: BaseException) -> NoReturn:
        """``destroy`` could not remove the container: ``first`` and ``last`` are the failures of the
        first removal and of the unpause or second removal. Raises ``last`` (an engine may wrap it)."""
        del first
        raise last

    @abc.abstractmethod
    def _engine_unpause(self) -> None:
        """``thaw``'s unpause: a container that is not paused is fine; a failure is raised
        (``SubstrateError``)."""


class ContainerSubstrate(Substrate, ImageFlavors):
    """A substrate of containers of one sandbox image, built on first use. The skeleton both engines
    share lives here — the disk bound's mechanism (``disk_mode``), ``create`` (create, bound the
    layer, start, or remove again), ``create_from_image`` (``RecipeImages``: the same of a task
    image's sandbox image), ``leftovers`` — and each engine gives only its calls: the ``_engine_*``
    methods, ``disk_quota``, ``disk_tmpfs`` and ``build_image``."""

    sandbox_class: ClassVar[type[ContainerSandbox]]
    layer_driver: ClassVar[str]  # the engine's overlay storage driver's name, for the disk bound's text

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self._image: str | None = None
        self._image_lock = threading.Lock()
        self.flavor = "base"
        self._disk: tuple[str, str | None, str | None] | None = None  # (mode, quota's why, tmpfs's why)
        self._task_images: dict[str, str] = {}  # task image -> its sandbox image (``_task_sandbox_image``)
        self._users: dict[str, str | None] = {}  # sandbox image -> its non-root USER (``_image_user``)
        self._recipe_images: dict[str, str] = {}  # recipe digest -> its image (``build_recipe``)

    def use_flavor(self, flavor: str) -> None:
        """``ImageFlavors``: sandboxes made from now on run the image of rootfs ``flavor``."""
        if flavor not in images.FLAVORS:
            raise SubstrateError(f"{self.name}: unknown image flavor {flavor!r} (one of {', '.join(images.FLAVORS)})")
        with self._image_lock:
            if flavor != self.flavor:
                self.flavor, self._image = flavor, None

    @abc.abstractmethod
    def build_image(self) -> str:
        """The sandbox image's tag of ``self.flavor``, built first when absent (the engine's ``ensure_image``)."""

    def image(self) -> str:
        with self._image_lock:
            if self._image is None:
                self._image = self.build_image()
            return self._image

    # -- the disk bound ----------------------------------------------------------------------------
    @abc.abstractmethod
    def disk_quota(self) -> str | None:
        """None when the engine's storage takes a per-container size, else why not."""

    @abc.abstractmethod
    def disk_tmpfs(self) -> str | None:
        """None when the disk bound can be a tmpfs over a created container's layer folder (mounted
        before it starts), else why not."""

    def disk_mode(self) -> tuple[str, str]:
        """("quota" | "tmpfs" | "none", the mechanism's text for the current bound): the storage's own
        per-container quota where it takes one, else a tmpfs of the bound's size over the container's
        layer folder, else none (said). Decided once per substrate; the text follows ``limits``."""
        if self._disk is None:
            quota = self.disk_quota()
            tmpfs = None if quota is None else self.disk_tmpfs()
            self._disk = ("quota" if quota is None else "tmpfs" if tmpfs is None else "none", quota, tmpfs)
        mode, quota, tmpfs = self._disk
        lim = self.limits.disk_bound_mb
        if mode == "quota":
            return mode, f"{lim} MiB: --storage-opt size (the storage's per-container quota)"
        if mode == "tmpfs":
            return mode, (f"{lim} MiB: a tmpfs of that size over the container's {self.layer_driver} layer folder "
                          "(its upper and work), mounted before it starts; ENOSPC inside it; its pages count "
                          f"against the memory bound too ({quota})")
        return mode, (f"not enforced: {quota}, and no tmpfs: {tmpfs}; a sandbox's writes go to the host's file "
                      "system unbounded")

    def limit_mechanisms(self) -> dict[str, str]:
        return limit_mechanisms(self.limits, self.disk_mode()[1])

    # -- create --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _engine_create(self, image: str, sid: str, workdir: str | None, lim: SandboxLimits,
                       user: str | None = None) -> str:
        """Create (not start) a container of ``image`` with ``REAPER_ARGV``, no network, the labels
        ``LABEL_RUN`` and ``LABEL_SANDBOX`` = ``sid``, the bounds ``lim`` (the storage quota when
        ``disk_mode`` says so), no-new-privileges and working folder ``workdir`` (None: the image's
        own), as ``user`` (None: the image's ``USER``); its id. ``SubstrateError`` leaves none."""

    @abc.abstractmethod
    def _engine_start(self, cid: str) -> None:
        """Start the created container (``SubstrateError`` when it does not)."""

    @abc.abstractmethod
    def _engine_remove(self, cid: str) -> None:
        """Remove the container by force, quietly (gone already is fine; a failure is not raised)."""

    @abc.abstractmethod
    def _engine_layer_dirs(self, cid: str) -> tuple[Path, Path]:
        """The created container's overlay upper and work folders on the host (``SubstrateError``)."""

    @abc.abstractmethod
    def _engine_image_exists(self, tag: str) -> bool:
        """Whether the engine holds an image under ``tag``."""

    @abc.abstractmethod
    def _engine_sandbox_layer(self, base: str, tag: str) -> None:
        """Commit the sandbox layer (``layer_tar``) on top of task image ``base`` under ``tag``: the
        base's own config kept (files, ``Env``, ``WorkingDir``, ``User``), ``Cmd`` ``REAPER_ARGV``,
        no entrypoint, the labels ``task_labels(base)``. The caller holds ``build_lock`` of the
        engine's images; ``SubstrateError`` when it fails."""

    def create(self) -> ContainerSandbox:
        """A container of the image: created, its layer folder under the disk bound's tmpfs
        (``disk_mode``), started; a failure anywhere removes the container and the tmpfs again."""
        return self._create_of(self.image(), PATHS.work, self.limits)

    def build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages.build_recipe``: the engine's build (``_engine_build_recipe``), asked once per
        recipe and substrate (a reset asks for its task's image, and its environment again)."""
        key = recipe.digest()
        with self._image_lock:
            known = self._recipe_images.get(key)
        if known is None:
            known = self._engine_build_recipe(recipe)
            with self._image_lock:
                self._recipe_images[key] = known
        return known

    def _engine_build_recipe(self, recipe: ImageRecipe) -> str:
        """The engine's build of ``recipe`` (``recipe_build``): its image's reference."""
        raise SubstrateError(f"{self.name} cannot build task images")

    def image_layout(self, image: str) -> ImageLayout:
        """The layer folders and config of built image ``image`` (``image_layout``): what the
        ``overlay`` substrate mounts to run a task's image built here."""
        return image_layout(self.name, image, self._engine_inspect_image(image))

    def _engine_inspect_image(self, image: str) -> Mapping[str, Any]:
        """The engine's ``image inspect`` record of ``image``."""
        raise SubstrateError(f"{self.name} cannot inspect images")

    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> ContainerSandbox:
        """``RecipeImages.create_from_image``: a container (as ``create`` makes one) of the sandbox
        image of task image ``image`` (``_task_sandbox_image``: the sandbox layer committed on top,
        once per image). Its working folder is the image's own ``WORKDIR`` (the reaper's; every
        exec is given its own ``cwd``), its user the image's ``USER``."""
        tag = self._task_sandbox_image(image)
        return self._create_of(tag, None, limits or self.limits, self._image_user(tag))

    def _image_user(self, tag: str) -> str | None:
        """The ``USER`` of image ``tag`` when it is not root (None: root), read once per image."""
        with self._image_lock:
            if tag in self._users:
                return self._users[tag]
        user = str((self._engine_inspect_image(tag).get("Config") or {}).get("User") or "")
        found = None if is_root_user(user) else user
        with self._image_lock:
            self._users[tag] = found
        return found

    def _task_sandbox_image(self, image: str) -> str:
        """The tag of task image ``image``'s sandbox image (``task_sandbox_tag``), committed first
        when absent (under the engine's image lock, checked before and after taking it); kept by
        this substrate once known."""
        with self._image_lock:
            known = self._task_images.get(image)
        if known is not None:
            return known
        tag = task_sandbox_tag(image)
        if not self._engine_image_exists(tag):
            with build_lock(f"{self.name}-image"):
                if not self._engine_image_exists(tag):
                    if not self._engine_image_exists(image):
                        raise SubstrateError(f"{self.name}: no image {image} (build_recipe makes a task's image)")
                    self._engine_sandbox_layer(image, tag)
        with self._image_lock:
            self._task_images[image] = tag
        return tag

    def _create_of(self, image: str, workdir: str | None, limits: SandboxLimits,
                   user: str | None = None) -> ContainerSandbox:
        """``create`` of ``image`` with working folder ``workdir`` (None: the image's own), bounded by
        ``limits``; with ``user`` (an image's non-root ``USER``) the container is root's and the
        sandbox's own commands run as ``user`` (``ContainerSandbox.exec_user``)."""
        sid = new_sandbox_id()
        cid = self._engine_create(image, sid, workdir, limits, "0" if user else None)
        try:
            layer = self._bound_disk(cid, sid, limits)
            self._engine_start(cid)
            if layer is not None and os.stat(layer / "diff").st_dev == os.stat(layer.parent).st_dev:
                # the engine bound its storage folder over itself after the tmpfs was mounted: shadowed
                raise SubstrateError(f"{self.name}: the disk bound of {cid[:12]} is not in effect (its layer "
                                     "folder is on the storage's file system after start)")
        except BaseException:
            unbind_disk(self.run_id, sid)
            self._engine_remove(cid)
            raise
        box = self.sandbox_class(self, cid, sid)
        box.exec_user = user
        return box.handed_over()

    def _bound_disk(self, cid: str, sid: str, limits: SandboxLimits) -> Path | None:
        """The tmpfs disk bound over the created (not started) container's layer folder; that folder
        (None: no tmpfs bound)."""
        if limits.disk_bound_mb is None or self.disk_mode()[0] != "tmpfs":
            return None
        upper, work = self._engine_layer_dirs(cid)
        return bound_container_layer(self.name, cid, upper, work, limits.disk_bound_mb,
                                     disk_source(self.run_id, sid))

    # -- what a run leaves -----------------------------------------------------------------------------
    @abc.abstractmethod
    def _engine_containers(self) -> list[tuple[str, str]]:
        """(id, state) of every container labelled with this run (``SubstrateError``: cannot list)."""

    def _kept_files(self) -> list[str]:
        """What else of this run the engine keeps on the host (one line each); none by default."""
        return []

    def leftovers(self) -> list[str]:
        try:
            left = [f"container {cid[:12]} ({state})" for cid, state in self._engine_containers()]
        except SubstrateError as e:
            return [f"{self.name}: cannot list containers: {e}"]
        left += self._kept_files()
        # a disk-bound tmpfs goes with its container; one left without containers is a leftover itself
        return left or [f"mount {p}" for p in mounts_of_source(disk_source(self.run_id))]


def gc_containers(engine: str, labelled: Iterable[Mapping[str, Any]], dead_runs: set[str],
                  remove: Callable[[str], object], build_containers: Callable[[], Iterable[str]],
                  removed: list[str]) -> list[str]:
    """Remove the containers of ``dead_runs`` (``labelled``: the engine's containers that carry
    ``LABEL_RUN``) and, when no build is in progress, the throw-away build containers. One line per
    container, appended to ``removed`` as it goes (an engine failing midway keeps what was done)."""
    for c in labelled:
        run = (c.get("Labels") or {}).get(LABEL_RUN)
        if run in dead_runs:
            remove(c["Id"])
            removed.append(f"{engine} container {c['Id'][:12]} of run {run}")
    with build_lock(f"{engine}-image", wait=False) as free:
        if free:  # no build in progress: its throw-away containers are leftovers
            for cid in build_containers():
                remove(cid)
                removed.append(f"{engine} build container {cid[:12]}")
    return removed


def engine_main(substrate: type[Substrate], ensure_image: Callable[[str], object], argv: list[str] | None,
                actions: Mapping[str, Callable[[], object]] | None = None) -> int:
    """``python -m drumsbench.substrates.containers.<engine> ACTION``: ``ensure-image`` (the base
    sandbox image), ``ensure-desktop-image``, ``missing`` and the engine's own ``actions``."""
    import argparse

    more = {"ensure-desktop-image": lambda: ensure_image("desktop"), **(actions or {})}
    parser = argparse.ArgumentParser(prog=f"python -m drumsbench.substrates.containers.{substrate.name}")
    parser.add_argument("action", choices=sorted(["ensure-image", "missing", *more]))
    args = parser.parse_args(argv)
    try:
        if args.action == "missing":
            what = substrate.missing()
            print(what or f"{substrate.name}: usable")
            return 1 if what else 0
        more.get(args.action, lambda: ensure_image("base"))()
    except SubstrateError as e:
        print(f"drumsbench: {e}", file=sys.stderr)
        return 1
    return 0
