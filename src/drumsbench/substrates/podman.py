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

To look at it by hand: ``eval "$(python -m drumsbench.substrates.podman env)"; podman ps -a``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from drumsbench import images
from drumsbench.errors import SubstrateError
from drumsbench.substrates import containers as C
from drumsbench.substrates.base import (
    DEFAULT_OUTPUT_LIMIT,
    Capabilities,
    ExecResult,
    Freezable,
    Isolation,
    ResetStrategy,
    Sandbox,
    SandboxFrozen,
    Substrate,
)
from drumsbench.substrates.hostproc import run_bounded

PODMAN_ERROR = 125  # podman's own failure (also a command's possible exit code: checked)
# podman exec's exit code when it cannot create the exec session (a paused or stopped container)
PODMAN_EXEC_REFUSED = 255
RUNTIME_DIR = Path("/dev/shm/drumsbench-podman")


def config_dir() -> Path:
    return images.cache_dir() / "podman"


def _limit(res: int, want: int) -> int:
    hard = resource.getrlimit(res)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def config_files() -> dict[str, str]:
    """File name -> content of the private podman configuration for this host."""
    nofile = _limit(resource.RLIMIT_NOFILE, 20000)
    nproc = _limit(resource.RLIMIT_NPROC, 32768)
    runtime = shutil.which("runc") or "runc"
    containers_conf = f"""\
# Written by drumsbench.substrates.podman.configure(); do not edit (it is rewritten).
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
# Written by drumsbench.substrates.podman.configure(); do not edit (it is rewritten).
[storage]
driver = "overlay"
graphroot = "{config_dir() / "storage"}"
runroot = "{RUNTIME_DIR}/storage"
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


def ensure_image() -> str:
    """The sandbox image's tag, importing the rootfs and building the layer first when absent."""
    tag = C.sandbox_tag()
    if image_exists(tag):
        return tag
    with C.build_lock("podman-image"):
        if image_exists(tag):
            return tag
        t0 = time.monotonic()
        rootfs = images.rootfs_tag()
        if not image_exists(rootfs):
            tar = C.ensure_rootfs_tar_verbose("podman")
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
                    f"ENV PATH={C.CONTAINER_PATH}",
                    "--change",
                    f"ENV HOME={C.PATHS.home}",
                    "--change",
                    "LABEL drumsbench.image=sandbox",
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


class PodmanSandbox(Sandbox, Freezable):
    def __init__(self, sub: PodmanSubstrate, cid: str, sid: str) -> None:
        self.substrate = sub.name
        self.run_id = sub.run_id
        self.id = sid
        self.container_id = cid
        self.paths = C.PATHS
        self._destroyed = False
        self._exe = sub.exe
        self._env = configure()

    def _check(self) -> None:
        if self._destroyed:
            raise SubstrateError(f"podman: sandbox {self.id} is destroyed")

    def _running(self) -> bool:
        proc = podman(
            ["container", "inspect", "--format", "{{.State.Running}}", self.container_id],
            check=False,
        )
        return proc.returncode == 0 and proc.stdout.strip() == b"true"

    def _exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        output_limit: int,
    ) -> ExecResult:
        cmd = [self._exe, "--log-level=error", "exec"]
        if stdin is not None:
            cmd.append("--interactive")
        cmd += ["--workdir", cwd]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd += [self.container_id, *argv]
        return run_bounded(
            cmd, timeout=timeout, cwd=None, env=self._env, stdin=stdin, output_limit=output_limit
        )

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        self._check()
        token = C.new_token()
        res = self._exec(
            C.argv_of(command),
            timeout=timeout,
            cwd=cwd or C.PATHS.work,
            env=C.exec_env(token, env),
            stdin=stdin,
            output_limit=output_limit,
        )
        if res.timed_out:
            # run_bounded killed the podman client; the command lives on in the container.
            kill = podman(
                [
                    "exec",
                    self.container_id,
                    "python3",
                    "-S",
                    "-c",
                    C.KILL_SCRIPT,
                    f"{C.EXEC_VAR}={token}",
                ],
                check=False,
                timeout=60,
            )
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
    def write_file(self, path: str, data: bytes) -> None:
        self._put({path: data})

    def put_files(self, base: str, files: Mapping[str, bytes]) -> None:
        self._put({f"{base.rstrip('/')}/{rel}": data for rel, data in files.items()})

    def _put(self, files: Mapping[str, bytes]) -> None:
        self._check()
        res = self._exec(
            ["tar", "-x", "-f", "-", "-C", "/", "--no-same-owner"],
            timeout=120,
            cwd="/",
            env={"PATH": C.CONTAINER_PATH},
            stdin=C.files_tar(files),
            output_limit=4096,
        )
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
        res = self._exec(
            ["/bin/sh", "-c", C.READ_SCRIPT, "sh", path, "" if limit is None else str(limit)],
            timeout=120,
            cwd="/",
            env={"PATH": C.CONTAINER_PATH},
            stdin=None,
            output_limit=(1 << 62) if limit is None else max(limit, 1),
        )
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

    # -- reset and destroy ----------------------------------------------------------------------
    def reset_in_place(self) -> None:
        self._run_checked(["/bin/sh", "-c", C.RESET_SCRIPT], "in-place reset")

    def end_processes(self) -> None:
        """Kill every process in the container but its reaper (``containers.END_SCRIPT``, run in
        the container's own pid namespace); files stay."""
        self._run_checked(C.END_ARGV, "ending the sandbox's processes", timeout=60.0)

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
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
    def probe(self, timeout: float = 5.0) -> str | None:
        """Podman's record of the container (``State``: paused, not running, OOM-killed); podman
        not answering. Never changes the container."""
        if self._destroyed:
            return f"podman: sandbox {self.id} is destroyed"
        wait = max(timeout, 15.0)  # a CLI process on a loaded host is slow, not absent
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
        found = C.state_evidence("podman", state)
        if found:
            return found
        # No liveness command: it would run under the sandbox's own limits, which the policy can
        # exhaust (a fork bomb), and so would not be evidence out of its reach.
        return None

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


class PodmanSubstrate(Substrate):
    name = "podman"
    sandbox_class = PodmanSandbox
    capabilities = Capabilities(
        isolation=Isolation.CONTAINER,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=False,
        network=False,
        notes="podman containers via the CLI (runc, private config); --network none; "
        "pids and memory limits",
    )

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        exe = shutil.which("podman")
        if exe is None:
            raise SubstrateError(
                "podman: not installed: apt-get install podman (or run scripts/setup.sh)"
            )
        self.exe = exe
        self._image: str | None = None
        self._image_lock = threading.Lock()

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

    def image(self) -> str:
        with self._image_lock:
            if self._image is None:
                self._image = ensure_image()
            return self._image

    def create(self) -> Sandbox:
        image = self.image()
        sid = C.new_sandbox_id()
        proc = podman(
            [
                "run",
                "--detach",
                "--network",
                "none",
                "--label",
                f"{C.LABEL_RUN}={self.run_id}",
                "--label",
                f"{C.LABEL_SANDBOX}={sid}",
                "--pids-limit",
                str(C.PIDS_LIMIT),
                "--memory",
                C.MEMORY_LIMIT,
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
                f"podman: cannot start a container of {image}: {C.decode_tail(proc.stderr)}"
            )
        return PodmanSandbox(self, cid, sid)

    def raw_floor(self) -> list[str] | None:
        """`podman run --rm` through the CLI, with the same private configuration."""
        exe = shutil.which("podman") or "podman"
        pairs = [f"{k}={v}" for k, v in configure().items()]
        return ["env", "-i", *pairs, exe, "--log-level=error", "run", "--rm", "--network", "none", ensure_image(),
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
        return [f"container {line}" for line in proc.stdout.decode().splitlines() if line.strip()]

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        if not dead_runs or shutil.which("podman") is None:
            return []
        proc = podman(
            ["ps", "--all", "--filter", f"label={C.LABEL_RUN}", "--format", "json"], check=False
        )
        if proc.returncode != 0:
            return []
        removed = []
        for c in json.loads(proc.stdout or b"[]") or []:
            run = (c.get("Labels") or {}).get(C.LABEL_RUN)
            if run in dead_runs:
                podman(["rm", "--force", "--time", "0", c["Id"]], check=False)
                removed.append(f"podman container {c['Id'][:12]} of run {run}")
        with C.build_lock("podman-image", wait=False) as free:
            if free:  # no build in progress: its throw-away containers are leftovers
                proc = podman(["ps", "--all", "--format", "{{.ID}} {{.Names}}"], check=False)
                for line in proc.stdout.decode().splitlines():
                    cid, _, names = line.partition(" ")
                    if names.startswith(C.BUILD_PREFIX):
                        podman(["rm", "--force", "--time", "0", cid], check=False)
                        removed.append(f"podman build container {cid[:12]}")
        return removed


def _conmon_in_libexec() -> bool:
    return any(os.access(p, os.X_OK) for p in ("/usr/libexec/podman/conmon", "/usr/bin/conmon"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m drumsbench.substrates.podman")
    parser.add_argument("action", choices=["configure", "ensure-image", "env", "missing"])
    args = parser.parse_args(argv)
    try:
        if args.action == "configure":
            configure()
        elif args.action == "env":
            env = configure()
            for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"):
                print(f"export {k}={env[k]}")
        elif args.action == "missing":
            what = PodmanSubstrate.missing()
            print(what or "podman: usable")
            return 1 if what else 0
        else:
            ensure_image()
    except SubstrateError as e:
        print(f"drumsbench: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
