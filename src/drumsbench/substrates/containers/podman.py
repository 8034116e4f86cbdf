"""``podman``: each sandbox is a podman container, driven through the podman CLI.

Same image, labels, limits and behaviour as ``docker`` (see ``containers``): no network
(``--network none``), pid 1 a reaper, exec with a per-command token that ``KILL_SCRIPT`` uses to
kill what a timed-out command started, the same in-place reset.

Podman runs with a **project-private configuration** so it neither depends on nor disturbs the
host's: ``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF`` point at files that ``configure()``
writes under ``images.cache_dir()/podman/``:

- ``runtime = "runc"`` (crun fails on hybrid cgroup v1/v2 layouts) and ``cgroup_manager =
  "cgroupfs"`` (no systemd needed), no events log (it would grow on the tmpfs);
- ``default_ulimits`` no higher than this host's hard limits (podman's own default of 1048576
  open files fails with "setrlimit: Operation not permitted" where the hard limit is lower and
  there is no CAP_SYS_RESOURCE): ``nofile=20000:20000`` and ``nproc=32768:32768`` here;
- private storage (``graphroot`` under the cache folder, ``runroot`` and ``tmp_dir`` on the
  tmpfs /dev/shm so that a reboot forgets running state).

To look at it by hand: ``eval "$(python -m drumsbench.substrates.containers.podman env)"; podman ps -a``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    Capabilities,
    ExecRequest,
    ExecResult,
    InitLaunching,
    Isolation,
    LaunchView,
    ResetStrategy,
    SandboxFrozen,
    Stream,
)
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.containers import host_entry
from drumsbench.substrates.exec_core import SANDBOX_PATH, run_bounded, start_stream
from drumsbench.substrates.hostproc import mounts_of_source

PODMAN_ERROR = 125  # podman's own failure (also a command's possible exit code: checked)
# podman exec's exit code when it cannot create the exec session (a paused or stopped container)
PODMAN_EXEC_REFUSED = 255
RUNTIME_DIR = Path("/dev/shm/drumsbench-podman")


def config_dir() -> Path:
    return images.cache_dir() / "podman"


def work_dir() -> Path:
    """The working folder of every podman process (and so of its conmon): conmon writes an ``oom``
    marker into its working folder when a container's process is OOM-killed, which must not be the
    harness's (the host's) working folder."""
    return config_dir() / "cwd"


def _limit(res: int, want: int) -> int:
    hard = resource.getrlimit(res)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def config_files() -> dict[str, str]:
    """File name -> content of the private podman configuration for this host."""
    nofile = _limit(resource.RLIMIT_NOFILE, 20000)
    nproc = _limit(resource.RLIMIT_NPROC, 32768)
    runtime = shutil.which("runc") or "runc"
    containers_conf = f"""\
# Written by drumsbench.substrates.containers.podman.configure(); do not edit (it is rewritten).
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
log_driver = "k8s-file"
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "{RUNTIME_DIR}/libpod"

[engine.runtimes]
runc = ["{runtime}"]
"""
    storage_conf = f"""\
# Written by drumsbench.substrates.containers.podman.configure(); do not edit (it is rewritten).
[storage]
driver = "overlay"
graphroot = "{config_dir() / "storage"}"
runroot = "{RUNTIME_DIR}/storage"

[storage.options.overlay]
# never bind the storage's overlay folder over itself: podman binds it (not recursively) when a
# command starts and detaches it when one ends with no container running, so a disk-bound tmpfs
# mounted over a container's layer folder between create and start would be shadowed by the next
# command's bind (and its layer folder left undeletable)
skip_mount_home = "true"
"""
    return {"containers.conf": containers_conf, "storage.conf": storage_conf}


_configured: dict[str, str] | None = None
_configure_lock = threading.Lock()


def configure() -> dict[str, str]:
    """Write the private configuration when it differs; the environment that selects it."""
    global _configured
    with _configure_lock:
        if _configured is not None:
            return _configured
        folder = config_dir()
        folder.mkdir(parents=True, exist_ok=True)
        work_dir().mkdir(exist_ok=True)
        for name, content in config_files().items():
            path = folder / name
            try:
                current = path.read_text()
            except OSError:
                current = None
            if current != content:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(content)
                tmp.rename(path)
        env = dict(os.environ)
        env.update(
            CONTAINERS_CONF=str(folder / "containers.conf"),
            CONTAINERS_STORAGE_CONF=str(folder / "storage.conf"),
            PODMAN_IGNORE_CGROUPSV1_WARNING="1",
        )
        _configured = env
        return env


def podman(
    args: Sequence[str], *, check: bool = True, timeout: float = 120, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``podman --log-level=error ARGS`` with the private configuration."""
    exe = shutil.which("podman")
    if exe is None:
        raise SubstrateError(
            "podman: not installed: apt-get install podman (or run scripts/setup.sh)"
        )
    try:
        proc = subprocess.run(
            [exe, "--log-level=error", *args],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env=configure(),
            cwd=work_dir(),
        )
    except subprocess.TimeoutExpired as e:
        raise SubstrateError(f"podman {args[0]}: no answer within {timeout:.0f} s") from e
    if check and proc.returncode != 0:
        raise SubstrateError(
            f"podman {args[0]} failed (exit {proc.returncode}): {C.decode_tail(proc.stderr)}"
        )
    return proc


def image_exists(tag: str) -> bool:
    return podman(["image", "exists", tag], check=False).returncode == 0


def ensure_image(flavor: str = "base") -> str:
    """The sandbox image's tag of rootfs ``flavor``, importing the rootfs and building the layer
    first when absent."""
    tag = C.sandbox_tag(flavor)
    if image_exists(tag):
        return tag
    with C.build_lock("podman-image"):
        if image_exists(tag):
            return tag
        t0 = time.monotonic()
        rootfs = images.rootfs_tag(flavor)
        if not image_exists(rootfs):
            tar = C.ensure_rootfs_tar_verbose("podman", flavor)
            C.progress(f"podman: importing {tar.name} as {rootfs} (about 10 s, once)")
            podman(["import", "--quiet", str(tar), rootfs], timeout=900)
        C.progress(f"podman: building the sandbox image {tag}")
        name = C.build_name(tag)
        podman(["rm", "--force", "--time", "0", name], check=False)  # left by a crashed build
        build = (
            podman(["create", "--network", "none", "--name", name, rootfs, "true"])
            .stdout.decode()
            .strip()
        )
        try:
            podman(["cp", "-", f"{build}:/"], stdin=C.layer_tar())
            podman(
                [
                    "commit",
                    "--quiet",
                    "--change",
                    f"CMD {json.dumps(C.REAPER_ARGV)}",
                    "--change",
                    f"WORKDIR {C.PATHS.work}",
                    "--change",
                    f"ENV PATH={SANDBOX_PATH}",
                    "--change",
                    f"ENV HOME={C.PATHS.home}",
                    "--change",
                    f"LABEL drumsbench.image={C.image_label(flavor)}",
                    "--change",
                    f"LABEL drumsbench.rootfs={rootfs}",
                    build,
                    tag,
                ],
                timeout=600,
            )
        finally:
            podman(["rm", "--force", build], check=False)
        C.progress(f"podman: {tag} ready ({time.monotonic() - t0:.1f} s)")
        return tag


def checkpoint_dir(state_dir: Path, run_id: str) -> Path:
    """Where a run keeps its exported container checkpoints (removed by ``drop_checkpoint``, and by
    ``gc`` for a dead run)."""
    return state_dir / "podman-checkpoints" / run_id


def _criu_env() -> dict[str, str]:
    """podman's environment with CRIU (>= 4, ``core.criu_binary``) first on PATH: runc runs ``criu``."""
    from drumsbench.core import criu_binary

    path = criu_binary.criu_path()
    if path is None:
        raise SubstrateError(f"podman: container checkpoints need CRIU: {criu_binary.missing()}")
    env = dict(configure())
    env["PATH"] = f"{os.path.dirname(path)}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


def _with_criu(exe: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[bytes] | None:
    """``podman --log-level=error ARGS`` with CRIU on its PATH (``_criu_env``); None when it did not
    end within ``timeout`` (s)."""
    try:
        return subprocess.run([exe, "--log-level=error", *args], capture_output=True, timeout=timeout,
                              env=_criu_env(), cwd=work_dir())
    except subprocess.TimeoutExpired:
        return None


def _criu_errors(stderr: bytes) -> str:
    """The ``Error`` lines of the CRIU log that podman's message names (read before the container,
    and the log with it, may go)."""
    m = re.search(rb"log file: (\S+?\.log)", stderr)
    if not m:
        return ""
    try:
        lines = Path(m.group(1).decode()).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.split(": ", 1)[-1] for line in lines if "Error (" in line and "RLIMIT_NOFILE" not in line]
    return "CRIU: " + "; ".join(errors[:4]) if errors else ""


class PodmanSandbox(C.ContainerSandbox, InitLaunching):
    def __init__(self, sub: PodmanSubstrate, cid: str, sid: str) -> None:
        super().__init__(sub, cid, sid)
        self._exe = sub.exe
        self._env = configure()

    def init_view(self) -> LaunchView:
        return host_entry.init_view(self.entry(), C.ROOT)

    def _upper_dir(self) -> Path:
        proc = podman(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", self.container_id], check=False)
        upper = proc.stdout.decode().strip()
        if proc.returncode != 0 or not upper.startswith("/"):
            raise SubstrateError(f"podman: sandbox {self.id}: no overlay upper folder in the engine's record: "
                                 f"{C.decode_tail(proc.stderr)}")
        return Path(upper)

    def checkpoint_export(self, path: Path, timeout: float = 300.0) -> None:
        """``podman container checkpoint --leave-running --export PATH``: the whole container (its
        processes through CRIU, its file changes) into one archive; the container goes on."""
        self._check()
        path.parent.mkdir(parents=True, exist_ok=True)
        # --file-locks: LibreOffice holds locks on its document and profile
        proc = _with_criu(self._exe, ["container", "checkpoint", "--leave-running", "--file-locks",
                                      f"--export={path}", self.container_id], timeout)
        if proc is None:
            path.unlink(missing_ok=True)
            raise SubstrateError(f"podman: checkpoint of {self.container_id[:12]}: no answer within {timeout:.0f} s")
        if proc.returncode != 0:
            path.unlink(missing_ok=True)
            raise SubstrateError(f"podman: checkpoint of {self.container_id[:12]} failed: "
                                 f"{_criu_errors(proc.stderr) or C.decode_tail(proc.stderr)}")

    def _engine_pid(self) -> int:
        proc = podman(["container", "inspect", "--format", "{{.State.Pid}}", self.container_id], check=False)
        return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0

    def _running(self) -> bool:
        proc = podman(
            ["container", "inspect", "--format", "{{.State.Running}}", self.container_id],
            check=False,
        )
        return proc.returncode == 0 and proc.stdout.strip() == b"true"

    def _exec_argv(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], interactive: bool) -> list[str]:
        """The ``podman exec`` command line of ``argv`` with exactly ``env``."""
        cmd = [self._exe, "--log-level=error", "exec"]
        if interactive:
            cmd.append("--interactive")
        cmd += ["--workdir", cwd]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        return [*cmd, self.container_id, *argv]

    def _podman_exec(self, req: ExecRequest, env: Mapping[str, str]) -> ExecResult:
        """``podman exec`` of ``req`` with exactly ``env``, bounded and killed on timeout (the
        client: what it started in the container lives on)."""
        cmd = self._exec_argv(req.argv, req.cwd, env, req.stdin is not None)
        return run_bounded(
            cmd, timeout=req.timeout, cwd=str(work_dir()), env=self._env, stdin=req.stdin,
            output_limit=req.output_limit
        )

    def _open_marked(self, argv: list[str], cwd: str, env: Mapping[str, str], token: str) -> Stream:
        """``podman exec --interactive``: the stream's pipes are the client's stdin and stdout (its exit
        status is the command's; a podman that refuses the exec, e.g. in a paused container, ends it at
        once with podman's own, 125 or 255). ``close`` kills the client, then what carries ``token`` in
        the container."""
        def kill_inside() -> None:
            podman(["exec", self.container_id, *C.kill_argv(token)], check=False, timeout=60)

        return start_stream(self._exec_argv(argv, cwd, env, True), cwd=str(work_dir()), env=self._env,
                            on_close=kill_inside)

    def _run_marked(self, req: ExecRequest, token: str, env: Mapping[str, str]) -> ExecResult:
        res = self._podman_exec(req, env)
        if res.timed_out:
            # run_bounded killed the podman client; the command lives on in the container.
            kill = podman(["exec", self.container_id, *C.kill_argv(token)], check=False, timeout=60)
            if kill.returncode != 0 and not self._running():
                raise SubstrateError(f"podman: sandbox {self.id}: the container is gone")
            return res
        if res.exit_code in (PODMAN_ERROR, PODMAN_EXEC_REFUSED) and self._paused():
            raise SandboxFrozen(f"podman: sandbox {self.id}: exec refused: {C.decode_tail(res.stderr)}")
        if res.exit_code in (PODMAN_ERROR, PODMAN_EXEC_REFUSED) and not self._running():
            raise SubstrateError(
                f"podman: sandbox {self.id}: exec failed, the container is not running: "
                f"{C.decode_tail(res.stderr)}"
            )
        return res

    def _paused(self) -> bool:
        """Podman's record: is the container paused (by the host)?"""
        proc = podman(["container", "inspect", "--format", "{{.State.Status}}", self.container_id], check=False)
        return proc.returncode == 0 and proc.stdout.strip() == b"paused"

    # -- files ----------------------------------------------------------------------------------
    def _put(self, files: Mapping[str, bytes]) -> None:
        self._check()
        res = self._podman_exec(ExecRequest(["tar", "-x", "-f", "-", "-C", "/", "--no-same-owner"], 120, "/",
                                            stdin=C.files_tar(files), output_limit=4096), {"PATH": SANDBOX_PATH})
        if res.exit_code != 0 or res.timed_out:
            if not self._running():
                raise SubstrateError(f"podman: sandbox {self.id}: the container is gone")
            raise SubstrateError(
                f"podman: sandbox {self.id}: cannot write {', '.join(list(files)[:3])}: "
                f"{C.decode_tail(res.stderr)}"
            )

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        self._check()
        path = C.check_path(path)
        argv = ["/bin/sh", "-c", C.READ_SCRIPT, "sh", path, "" if limit is None else str(limit)]
        res = self._podman_exec(ExecRequest(argv, 120, "/", output_limit=(1 << 62) if limit is None else max(limit, 1)),
                                {"PATH": SANDBOX_PATH})
        if res.exit_code == 0 and not res.timed_out:
            return res.stdout
        if res.exit_code == C.READ_MISSING:
            raise FileNotFoundError(path)
        if res.exit_code == C.READ_IS_DIR:
            raise IsADirectoryError(path)
        if not self._running():
            raise SubstrateError(f"podman: sandbox {self.id}: the container is gone")
        raise SubstrateError(
            f"podman: sandbox {self.id}: cannot read {path}: {C.decode_tail(res.stderr)}"
        )

    # -- destroy ------------------------------------------------------------------------------
    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        C.unbind_disk(self.run_id, self.id)  # the disk bound's tmpfs first
        proc = podman(["rm", "--force", "--time", "0", self.container_id], check=False)
        if proc.returncode != 0 and b"no such container" not in proc.stderr.lower():
            # A frozen container that podman would not remove: unpause it, then remove.
            podman(["unpause", self.container_id], check=False)
            proc = podman(["rm", "--force", "--time", "0", self.container_id], check=False)
        if proc.returncode != 0 and b"no such container" not in proc.stderr.lower():
            raise SubstrateError(
                f"podman: cannot remove {self.container_id[:12]}: {C.decode_tail(proc.stderr)}"
            )

    # -- gate-side evidence ----------------------------------------------------------------------
    def _inspect_state(self, wait: float) -> Mapping[str, Any] | str:
        wait = max(wait, 15.0)  # a CLI process on a loaded host is slow, not absent
        try:
            proc = podman(["container", "inspect", "--format", "json", self.container_id],
                          check=False, timeout=wait)
        except SubstrateError as e:
            return f"podman: no answer to an inspect of the container: {e}"
        if proc.returncode != 0:
            if b"no such" in proc.stderr.lower():
                return f"podman: the container {self.container_id[:12]} is gone"
            return f"podman: inspect of the container failed: {C.decode_tail(proc.stderr)}"
        try:
            state = (json.loads(proc.stdout) or [{}])[0].get("State") or {}
        except (ValueError, IndexError, AttributeError) as e:
            return f"podman: unreadable inspect of the container: {e}"
        return state if isinstance(state, dict) else f"podman: unreadable inspect of the container: {state!r}"

    # -- host-side freeze (fault injection only) -------------------------------------------------
    def freeze(self) -> None:
        """``podman pause``: the cgroup freezer stops every process of the container."""
        self._check()
        podman(["pause", self.container_id])

    def thaw(self) -> None:
        if self._destroyed:
            return
        proc = podman(["unpause", self.container_id], check=False)
        if proc.returncode != 0 and b"not paused" not in proc.stderr.lower() \
                and b"state improper" not in proc.stderr.lower():
            raise SubstrateError(f"podman: cannot unpause {self.container_id[:12]}: "
                                 f"{C.decode_tail(proc.stderr)}")


class PodmanSubstrate(C.ContainerSubstrate):
    name = "podman"
    sandbox_class = PodmanSandbox
    capabilities = Capabilities(
        isolation=Isolation.CONTAINER,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=False,
        network=False,
        notes="podman containers via the CLI (runc, private config); --network none; "
        "pids, memory and disk limits",
    )

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        exe = shutil.which("podman")
        if exe is None:
            raise SubstrateError(
                "podman: not installed: apt-get install podman (or run scripts/setup.sh)"
            )
        self.exe = exe
        self._quota: tuple[str | None] | None = None  # (why the storage takes no size,) once asked

    def disk_quota(self) -> str | None:
        """None when podman's private overlay storage takes a per-container size, else why not
        (asked once: every create needs it)."""
        if self._quota is None:
            self._quota = (C.storage_quota("podman", "overlay", C.fs_type(config_dir())),)
        return self._quota[0]

    def disk_mode(self) -> tuple[str, str]:
        """("quota" | "tmpfs" | "none", the mechanism's text): podman's own quota where its storage
        takes one, else (root: podman is a CLI in this mount namespace) a tmpfs of the bound's size
        over the container's layer folder, mounted between ``podman create`` and ``podman start``."""
        lim = self.limits.disk_bound_mb
        quota = self.disk_quota()
        if quota is None:
            return "quota", f"{lim} MiB: --storage-opt size (the storage's per-container quota)"
        if os.geteuid() == 0:
            return "tmpfs", (f"{lim} MiB: a tmpfs of that size over the container's overlay layer folder (its "
                             "upper and work), mounted before it starts; ENOSPC inside it; its pages count "
                             f"against the memory bound too ({quota})")
        return "none", (f"not enforced: {quota}, and no tmpfs: needs root; a sandbox's writes go to the host's "
                        "file system unbounded")

    def limit_mechanisms(self) -> dict[str, str]:
        return C.limit_mechanisms(self.limits, self.disk_mode()[1])

    def _limit_args(self) -> list[str]:
        lim = self.limits
        args = ["--pids-limit", str(lim.pids if lim.pids is not None else -1)]
        if lim.memory_mb is not None:
            args += ["--memory", f"{lim.memory_mb}m"]
        if lim.disk_bound_mb is not None and self.disk_mode()[0] == "quota":
            args += ["--storage-opt", f"size={lim.disk_bound_mb}m"]
        return args

    @classmethod
    def missing(cls) -> str | None:
        for exe, pkg in (("podman", "podman"), ("runc", "runc"), ("conmon", "conmon")):
            if shutil.which(exe) is None and not (exe == "conmon" and _conmon_in_libexec()):
                return f"podman: {exe} is missing: apt-get install {pkg} (or run scripts/setup.sh)"
        if (
            not C.rootfs_tar_cached()
            and shutil.which("debootstrap") is None
            and not image_exists(C.sandbox_tag())
        ):
            return (
                "podman: the image is absent and debootstrap is missing to build it: "
                "run scripts/setup.sh"
            )
        return None

    def build_image(self) -> str:
        return ensure_image(flavor=self.flavor)

    def create(self) -> PodmanSandbox:
        """``podman create``, the disk bound over its layer folder (``disk_mode``), ``podman start``."""
        image = self.image()
        sid = C.new_sandbox_id()
        proc = podman(
            [
                "create",
                "--network",
                "none",
                "--label",
                f"{C.LABEL_RUN}={self.run_id}",
                "--label",
                f"{C.LABEL_SANDBOX}={sid}",
                *self._limit_args(),
                "--security-opt",
                "no-new-privileges",
                "--workdir",
                C.PATHS.work,
                image,
                *C.REAPER_ARGV,
            ],
            check=False,
        )
        cid = proc.stdout.decode().strip().splitlines()[-1] if proc.stdout.strip() else ""
        if proc.returncode != 0 or not cid:
            if cid:
                podman(["rm", "--force", "--time", "0", cid], check=False)
            raise SubstrateError(
                f"podman: cannot create a container of {image}: {C.decode_tail(proc.stderr)}"
            )
        try:
            layer = self._bound_disk(cid, sid)
            podman(["start", cid])
            if layer is not None and os.stat(layer / "diff").st_dev == os.stat(layer.parent).st_dev:
                # podman bound its storage folder over itself after the tmpfs was mounted: shadowed
                raise SubstrateError(f"podman: the disk bound of {cid[:12]} is not in effect (its layer folder "
                                     "is on the storage's file system after start)")
        except BaseException:
            C.unbind_disk(self.run_id, sid)
            podman(["rm", "--force", "--time", "0", cid], check=False)
            raise
        return PodmanSandbox(self, cid, sid).handed_over()

    def restore_import(self, archive: Path, timeout: float = 300.0) -> PodmanSandbox:
        """A new sandbox restored from a ``checkpoint_export`` archive (``podman container restore
        --import --name``): the processes go on where the checkpoint took them, in a new container
        with the original's labels (run, and the *original's* sandbox id) and limits. Its writable
        layer is podman's own: the tmpfs disk bound of ``create`` is not put on a restored container."""
        sid = C.new_sandbox_id()
        name = f"drumsbench-{self.run_id}-{sid}"
        proc = _with_criu(self.exe, ["container", "restore", "--file-locks", f"--import={archive}",
                                     f"--name={name}"], timeout)
        cid = proc.stdout.decode().strip().splitlines()[-1] if proc is not None and proc.stdout.strip() else ""
        if proc is None or proc.returncode != 0 or not cid:
            podman(["rm", "--force", "--time", "0", name], check=False)
            why = f"no answer within {timeout:.0f} s" if proc is None else f"failed: {C.decode_tail(proc.stderr)}"
            raise SubstrateError(f"podman: restore of {archive.name}: {why}")
        return PodmanSandbox(self, cid, sid).handed_over()

    def _bound_disk(self, cid: str, sid: str) -> Path | None:
        """The tmpfs disk bound over the created (not started) container's layer folder; returns
        that folder (None: no tmpfs bound)."""
        if self.limits.disk_bound_mb is None or self.disk_mode()[0] != "tmpfs":
            return None
        proc = podman(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}} {{.GraphDriver.Data.WorkDir}}",
                       cid], check=False)
        parts = proc.stdout.decode().split()
        if proc.returncode != 0 or len(parts) != 2:
            raise SubstrateError(f"podman: cannot find the layer folder of {cid[:12]}: {C.decode_tail(proc.stderr)}")
        upper, work = Path(parts[0]), Path(parts[1])
        return C.bound_container_layer("podman", cid, upper, work, self.limits.disk_bound_mb,
                                       C.disk_source(self.run_id, sid))

    def raw_floor(self) -> list[str] | None:
        """`podman run --rm` through the CLI, with the same private configuration."""
        exe = shutil.which("podman") or "podman"
        # the private configuration and PATH only: the harness's whole environment is no part of the
        # floor (and would land in the ledger with its argv)
        env = configure()
        pairs = [f"{k}={env[k]}" for k in ("PATH", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                                             "PODMAN_IGNORE_CGROUPSV1_WARNING") if k in env]
        return ["env", "-i", *pairs, exe, "--log-level=error", "run", "--rm", "--network", "none", self.image(),
                "true"]

    def leftovers(self) -> list[str]:
        proc = podman(
            [
                "ps",
                "--all",
                "--filter",
                f"label={C.LABEL_RUN}={self.run_id}",
                "--format",
                "{{.ID}} {{.State}}",
            ],
            check=False,
        )
        if proc.returncode != 0:
            return [f"podman: cannot list containers: {C.decode_tail(proc.stderr)}"]
        left = [f"container {line}" for line in proc.stdout.decode().splitlines() if line.strip()]
        folder = checkpoint_dir(self.state_dir, self.run_id)
        left += [f"checkpoint {p}" for p in sorted(folder.glob("*"))] if folder.is_dir() else []
        # a disk-bound tmpfs goes with its container; one left without containers is a leftover itself
        return left or [f"mount {p}" for p in mounts_of_source(C.disk_source(self.run_id))]

    def drop_checkpoint(self, archive: Path) -> None:
        """Remove an exported checkpoint (and the run's folder of them once empty)."""
        archive.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            archive.parent.rmdir()

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        if not dead_runs or shutil.which("podman") is None:
            return []
        proc = podman(
            ["ps", "--all", "--filter", f"label={C.LABEL_RUN}", "--format", "json"], check=False
        )
        if proc.returncode != 0:
            return []

        def builds() -> list[str]:
            listing = podman(["ps", "--all", "--format", "{{.ID}} {{.Names}}"], check=False).stdout.decode()
            return [cid for cid, _, names in (line.partition(" ") for line in listing.splitlines())
                    if names.startswith(C.BUILD_PREFIX)]

        for run in dead_runs:  # disk-bound tmpfs first (detached; freed as their containers go)
            C.unbind_disk(run)
            shutil.rmtree(checkpoint_dir(state_dir, run), ignore_errors=True)
        return C.gc_containers("podman", json.loads(proc.stdout or b"[]") or [], dead_runs,
                               lambda cid: podman(["rm", "--force", "--time", "0", cid], check=False), builds, [])


def _conmon_in_libexec() -> bool:
    return any(os.access(p, os.X_OK) for p in ("/usr/libexec/podman/conmon", "/usr/bin/conmon"))


def _print_env() -> None:
    env = configure()
    for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"):
        print(f"export {k}={env[k]}")


def main(argv: list[str] | None = None) -> int:
    return C.engine_main(PodmanSubstrate, ensure_image, argv, {"configure": configure, "env": _print_env})


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
