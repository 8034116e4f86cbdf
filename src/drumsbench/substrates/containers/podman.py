"""``podman``: each sandbox is a podman container, driven through the podman CLI.

Same image, labels, limits and behaviour as ``docker`` (see ``containers``): no network
(``--network none``), pid 1 a reaper, exec with a per-command token that ``kill_exec`` uses (from the
host) to kill what a timed-out command started, the same in-place reset.

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
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    Capabilities,
    ImageRecipe,
    Isolation,
    RecipeImages,
    ResetStrategy,
    SandboxLimits,
)
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.containers.podman_cli import checkpoint_dir, config_dir, configure, podman, with_criu
from drumsbench.substrates.containers.podman_sandbox import PodmanSandbox
from drumsbench.substrates.exec_core import SANDBOX_PATH


def image_exists(tag: str) -> bool:
    return podman(["image", "exists", tag], check=False).returncode == 0


def ensure_rootfs_image(flavor: str = "base") -> str:
    """The tag of the Debian rootfs of ``flavor`` as a plain image (no sandbox layer), imported from
    its tarball first when absent. The caller holds ``C.build_lock("podman-image")``."""
    rootfs = images.rootfs_tag(flavor)
    if not image_exists(rootfs):
        tar = C.ensure_rootfs_tar_verbose("podman", flavor)
        C.progress(f"podman: importing {tar.name} as {rootfs} (about 10 s, once)")
        podman(["import", "--quiet", str(tar), rootfs], timeout=900)
    return rootfs


def commit_layer(base: str, tag: str, changes: list[str], everyone: bool = False) -> None:
    """Commit the sandbox layer (``C.layer_tar(everyone)``) on top of image ``base`` under ``tag`` with a
    throw-away container; ``changes`` are the Dockerfile instructions the commit applies
    (``--change``): the base's own config stays where they name nothing. The caller holds
    ``C.build_lock("podman-image")``; ``SubstrateError`` when it fails."""
    name = C.build_name(tag)
    podman(["rm", "--force", "--time", "0", name], check=False)  # left by a crashed build
    build = podman(["create", "--network", "none", "--name", name, base, "true"]).stdout.decode().strip()
    try:
        podman(["cp", "-", f"{build}:/"], stdin=C.layer_tar(everyone))
        podman(["commit", "--quiet", *(a for c in changes for a in ("--change", c)), build, tag], timeout=600)
    finally:
        podman(["rm", "--force", build], check=False)


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
        rootfs = ensure_rootfs_image(flavor)
        C.progress(f"podman: building the sandbox image {tag}")
        commit_layer(rootfs, tag, [
            f"CMD {json.dumps(C.REAPER_ARGV)}",
            f"WORKDIR {C.PATHS.work}",
            f"ENV PATH={SANDBOX_PATH}",
            f"ENV HOME={C.PATHS.home}",
            f"LABEL drumsbench.image={C.image_label(flavor)}",
            f"LABEL drumsbench.rootfs={rootfs}",
        ])
        C.progress(f"podman: {tag} ready ({time.monotonic() - t0:.1f} s)")
        return tag


class PodmanSubstrate(C.ContainerSubstrate, RecipeImages):
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

    layer_driver = "overlay"

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        exe = shutil.which("podman")
        if exe is None:
            raise SubstrateError(
                "podman: not installed: apt-get install podman (or run scripts/setup.sh)"
            )
        self.exe = exe

    def disk_quota(self) -> str | None:
        return C.storage_quota("podman", "overlay", C.fs_type(config_dir()))

    def disk_tmpfs(self) -> str | None:
        """Also: podman is a CLI in this mount namespace, and its storage never binds its overlay
        folder over itself (``skip_mount_home``), so a tmpfs mounted before ``podman start`` stays."""
        return None if os.geteuid() == 0 else "needs root"

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

    def _engine_build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages``: ``podman build`` (``recipe_build``, ``podman_recipes``)."""
        from drumsbench.substrates.containers import recipe_build
        from drumsbench.substrates.containers.podman_recipes import PodmanEngine

        return recipe_build.build(PodmanEngine(), recipe)

    def _engine_inspect_image(self, image: str) -> Mapping[str, Any]:
        try:
            found = json.loads(podman(["image", "inspect", image]).stdout)
        except ValueError as e:
            raise SubstrateError(f"podman: image inspect {image}: not JSON ({e})") from e
        if not isinstance(found, list) or not found or not isinstance(found[0], dict):
            raise SubstrateError(f"podman: image inspect {image}: no record")
        return found[0]

    def _engine_image_exists(self, tag: str) -> bool:
        return image_exists(tag)

    def _engine_sandbox_layer(self, base: str, tag: str) -> None:
        # ENTRYPOINT [] clears the base's (the reaper must be pid 1); nothing else of its config is named
        commit_layer(base, tag, [f"CMD {json.dumps(C.REAPER_ARGV)}", "ENTRYPOINT []",
                                 *(f"LABEL {k}={v}" for k, v in C.task_labels(base).items())], everyone=True)

    def _engine_create(self, image: str, sid: str, workdir: str | None, lim: SandboxLimits,
                       user: str | None = None) -> str:
        args = ["--pids-limit", str(lim.pids if lim.pids is not None else -1)]
        if workdir is not None:
            args += ["--workdir", workdir]
        if user is not None:
            args += ["--user", user]
        if lim.memory_mb is not None:
            args += ["--memory", f"{lim.memory_mb}m"]
        if lim.cpus is not None:
            args += ["--cpus", f"{lim.cpus:g}"]
        if lim.disk_bound_mb is not None and self.disk_mode()[0] == "quota":
            args += ["--storage-opt", f"size={lim.disk_bound_mb}m"]
        proc = podman(["create", "--network", "none", "--label", f"{C.LABEL_RUN}={self.run_id}", "--label",
                       f"{C.LABEL_SANDBOX}={sid}", *args, "--security-opt", "no-new-privileges", image,
                       *C.REAPER_ARGV], check=False)
        cid = proc.stdout.decode().strip().splitlines()[-1] if proc.stdout.strip() else ""
        if proc.returncode != 0 or not cid:
            if cid:
                self._engine_remove(cid)
            raise SubstrateError(f"podman: cannot create a container of {image}: {C.decode_tail(proc.stderr)}")
        return cid

    def _engine_start(self, cid: str) -> None:
        podman(["start", cid])

    def _engine_remove(self, cid: str) -> None:
        podman(["rm", "--force", "--time", "0", cid], check=False)

    def _engine_layer_dirs(self, cid: str) -> tuple[Path, Path]:
        proc = podman(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}} {{.GraphDriver.Data.WorkDir}}",
                       cid], check=False)
        parts = proc.stdout.decode().split()
        if proc.returncode != 0 or len(parts) != 2:
            raise SubstrateError(f"podman: cannot find the layer folder of {cid[:12]}: {C.decode_tail(proc.stderr)}")
        return Path(parts[0]), Path(parts[1])

    def _engine_containers(self) -> list[tuple[str, str]]:
        proc = podman(["ps", "--all", "--filter", f"label={C.LABEL_RUN}={self.run_id}", "--format",
                       "{{.ID}} {{.State}}"], check=False)
        if proc.returncode != 0:
            raise SubstrateError(C.decode_tail(proc.stderr))
        return [(cid, state or "?") for cid, _, state in
                (line.strip().partition(" ") for line in proc.stdout.decode().splitlines() if line.strip())]

    def _kept_files(self) -> list[str]:
        """The run's exported checkpoints (``checkpoint_export``; ``drop_checkpoint`` removes one)."""
        folder = checkpoint_dir(self.state_dir, self.run_id)
        return [f"checkpoint {p}" for p in sorted(folder.glob("*"))] if folder.is_dir() else []

    def restore_import(self, archive: Path, timeout: float = 300.0) -> PodmanSandbox:
        """A new sandbox restored from a ``checkpoint_export`` archive (``podman container restore
        --import --name``): the processes go on where the checkpoint took them, in a new container
        with the original's labels (run, and the *original's* sandbox id) and limits. Its writable
        layer is podman's own: the tmpfs disk bound of ``create`` is not put on a restored container."""
        sid = C.new_sandbox_id()
        name = f"drumsbench-{self.run_id}-{sid}"
        proc = with_criu(self.exe, ["container", "restore", "--file-locks", f"--import={archive}",
                                     f"--name={name}"], timeout)
        cid = proc.stdout.decode().strip().splitlines()[-1] if proc is not None and proc.stdout.strip() else ""
        if proc is None or proc.returncode != 0 or not cid:
            podman(["rm", "--force", "--time", "0", name], check=False)
            why = f"no answer within {timeout:.0f} s" if proc is None else f"failed: {C.decode_tail(proc.stderr)}"
            raise SubstrateError(f"podman: restore of {archive.name}: {why}")
        return PodmanSandbox(self, cid, sid).handed_over()

    def raw_floor(self) -> list[str] | None:
        """`podman run --rm` through the CLI, with the same private configuration."""
        return self.raw_floor_of(self.image())

    def raw_floor_of(self, image: str) -> list[str] | None:
        """``podman run --rm`` of ``image`` (a task image too: ``RecipeImages``)."""
        exe = shutil.which("podman") or "podman"
        # the private configuration and PATH only: the harness's whole environment is no part of the
        # floor (and would land in the ledger with its argv)
        env = configure()
        pairs = [f"{k}={env[k]}" for k in ("PATH", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                                             "PODMAN_IGNORE_CGROUPSV1_WARNING") if k in env]
        return ["env", "-i", *pairs, exe, "--log-level=error", "run", "--rm", "--network", "none", image, "true"]

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
