"""``docker``: each sandbox is a container of the real Docker daemon, driven through the Python SDK.

Isolation: a container (own mount, pid, ipc, uts and network namespaces, a cgroup with a pids
and a memory limit), **no network at all** (``network_mode="none"``: only ``lo``). Commands run
as root inside the container with Docker's default capability set and ``no-new-privileges``.

Set-up: ``scripts/setup.sh`` installs docker.io and starts ``dockerd --bridge=none
--iptables=false``. The image (``containers.sandbox_tag()``) is built on first use if absent: the
Debian rootfs of ``drumsbench.images`` is imported under ``images.rootfs_tag()`` and the sandbox
layer committed on top (``python -m drumsbench.substrates.containers.docker ensure-image`` does it ahead).

This module is the substrate (its image, the container's creation through the skeleton of
``common.ContainerSubstrate``, what a run leaves, gc); one container is a ``docker_sandbox.DockerSandbox``
(exec over the exec API's socket, ``docker_wire``).

Known Docker behaviour: when a command leaves a background process holding its stdout or stderr,
the daemon keeps the exec's stream open for about 2 s after the command exits (and the next exec
in that container may wait about as long). Redirect the output of background processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
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
from drumsbench.substrates.containers.docker_sandbox import (
    HAVE_SDK,
    SOCKET_HINT,
    DockerSandbox,
    api_errors,
    connect,
)
from drumsbench.substrates.exec_core import SANDBOX_PATH

if HAVE_SDK:
    import docker
    import docker.errors


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.api.inspect_image(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_rootfs_image(client: Any, flavor: str = "base") -> str:
    """The tag of the Debian rootfs of ``flavor`` as a plain image (no sandbox layer), imported from
    its tarball first when absent. The caller holds ``C.build_lock("docker-image")``."""
    rootfs = images.rootfs_tag(flavor)
    if not image_exists(client, rootfs):
        tar = C.ensure_rootfs_tar_verbose("docker", flavor)
        C.progress(f"docker: importing {tar.name} as {rootfs} (a few seconds, once)")
        repo, _, rtag = rootfs.partition(":")
        try:
            client.api.import_image_from_file(str(tar), repository=repo, tag=rtag)
        except api_errors() as e:
            raise SubstrateError(f"docker: import of {tar} failed: {e}") from e
        if not image_exists(client, rootfs):
            raise SubstrateError(f"docker: import of {tar} did not produce {rootfs}")
    return rootfs


def commit_layer(client: Any, base: str, tag: str, conf: dict[str, Any], everyone: bool = False) -> None:
    """Commit the sandbox layer (``C.layer_tar(everyone)``) on top of image ``base`` under ``tag`` with a
    throw-away container; ``conf`` is what the commit sets: the daemon merges it with the base's
    own config (``WorkingDir``, ``Env``, ``User`` and labels stay unless ``conf`` names them). The
    caller holds ``C.build_lock("docker-image")``; ``SubstrateError`` when it fails."""
    repo, _, name = tag.partition(":")
    build = None
    with contextlib.suppress(docker.errors.NotFound):  # left by a crashed build
        client.api.remove_container(C.build_name(tag), force=True)
    try:
        build = client.api.create_container(base, command=["true"], name=C.build_name(tag),
                                            host_config=client.api.create_host_config(network_mode="none"))["Id"]
        client.api.put_archive(build, "/", C.layer_tar(everyone))
        client.api.commit(build, repository=repo, tag=name, conf=conf)
    except api_errors() as e:
        raise SubstrateError(f"docker: building {tag} failed: {e}") from e
    finally:
        if build is not None:
            with contextlib.suppress(*api_errors()):
                client.api.remove_container(build, force=True)


def ensure_image(client: Any | None = None, flavor: str = "base") -> str:
    """The sandbox image's tag of rootfs ``flavor``, importing the rootfs and building the layer
    first when absent."""
    if client is None:
        client = connect(timeout=900)
        try:
            return ensure_image(client, flavor)
        finally:
            client.close()
    tag = C.sandbox_tag(flavor)
    if image_exists(client, tag):
        return tag
    with C.build_lock("docker-image"):
        if image_exists(client, tag):
            return tag
        t0 = time.monotonic()
        rootfs = ensure_rootfs_image(client, flavor)
        C.progress(f"docker: building the sandbox image {tag}")
        commit_layer(client, rootfs, tag, {
            "Cmd": C.REAPER_ARGV,
            "WorkingDir": C.PATHS.work,
            "Env": [f"PATH={SANDBOX_PATH}", f"HOME={C.PATHS.home}"],
            "Labels": {"drumsbench.image": C.image_label(flavor), "drumsbench.rootfs": rootfs},
        })
        C.progress(f"docker: {tag} ready ({time.monotonic() - t0:.1f} s)")
        return tag


class DockerSubstrate(C.ContainerSubstrate, RecipeImages):
    name = "docker"
    sandbox_class = DockerSandbox
    capabilities = Capabilities(
        isolation=Isolation.CONTAINER,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=False,
        network=False,
        notes="Docker containers via the Python SDK; network_mode=none; pids and memory limits",
    )

    layer_driver = "overlay2"

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self.client = connect()
        # container id -> sandbox id of this instance's containers whose removal failed (``close``
        # removes them: a daemon that was down may answer again by then)
        self.unremoved: dict[str, str] = {}

    def disk_quota(self) -> str | None:
        try:
            info = self.client.info()
        except api_errors() as e:
            return f"docker info failed: {e}"
        status = dict((k, v) for k, v in info.get("DriverStatus") or [])
        return C.storage_quota("docker", str(info.get("Driver", "")), str(status.get("Backing Filesystem", "")))

    def disk_tmpfs(self) -> str | None:
        """Also: dockerd's storage driver is overlay2 and dockerd runs in this mount namespace."""
        if os.geteuid() != 0:
            return "needs root (a tmpfs over the container's layer folder)"
        errors: tuple[type[BaseException], ...] = (IndexError, ValueError, subprocess.SubprocessError, *api_errors())
        try:
            info = self.client.info()
            pidof = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, timeout=10)
            pid = int(pidof.stdout.split()[0])
            same_ns = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        except errors as e:
            return f"cannot tell dockerd's storage or mount namespace: {e}"
        if info.get("Driver") != "overlay2":
            return f"docker's storage driver is {info.get('Driver')}, not overlay2"
        if not same_ns:
            return "dockerd runs in another mount namespace"
        return None

    @classmethod
    def missing(cls) -> str | None:
        if not HAVE_SDK:
            return (
                "docker: the Python SDK is missing: pip install 'drumsbench[docker]' "
                "(or run scripts/setup.sh)"
            )
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            client = docker.from_env(version="auto", timeout=5)
            client.ping()
        except Exception:
            return f"docker: the daemon does not answer at {where}: {SOCKET_HINT}"
        try:
            if not image_exists(client, C.sandbox_tag()) and not C.rootfs_tar_cached():
                import shutil

                if shutil.which("debootstrap") is None:
                    return (
                        "docker: the image is absent and debootstrap is missing to build it: "
                        "run scripts/setup.sh"
                    )
        finally:
            client.close()
        return None

    def build_image(self) -> str:
        return ensure_image(flavor=self.flavor)

    def _engine_build_recipe(self, recipe: ImageRecipe) -> str:
        """``RecipeImages``: dockerd builds it (``recipe_build``, ``docker_recipes``)."""
        from drumsbench.substrates.containers import recipe_build
        from drumsbench.substrates.containers.docker_recipes import DockerEngine

        return recipe_build.build(DockerEngine(self.client), recipe)

    def _engine_inspect_image(self, image: str) -> Mapping[str, Any]:
        try:
            return dict(self.client.api.inspect_image(image))
        except api_errors() as e:
            raise SubstrateError(f"docker: cannot inspect image {image}: {e}") from e

    def _engine_image_exists(self, tag: str) -> bool:
        try:
            return image_exists(self.client, tag)
        except api_errors() as e:
            raise SubstrateError(f"docker: cannot inspect image {tag}: {e}") from e

    def _engine_sandbox_layer(self, base: str, tag: str) -> None:
        # an empty Entrypoint clears the base's (the reaper must be pid 1); the rest of its config is merged in
        commit_layer(self.client, base, tag, {"Cmd": C.REAPER_ARGV, "Entrypoint": [], "Labels": C.task_labels(base)},
                     everyone=True)

    def _engine_create(self, image: str, sid: str, workdir: str | None, lim: SandboxLimits,
                       user: str | None = None) -> str:
        api = self.client.api
        cfg: dict[str, Any] = {"network_mode": "none", "security_opt": ["no-new-privileges"],
                               "pids_limit": lim.pids if lim.pids is not None else -1}
        if lim.memory_mb is not None:
            cfg["mem_limit"] = f"{lim.memory_mb}m"
        if lim.cpus is not None:
            cfg["nano_cpus"] = round(lim.cpus * 1e9)
        if lim.disk_bound_mb is not None and self.disk_mode()[0] == "quota":
            cfg["storage_opt"] = {"size": f"{lim.disk_bound_mb}m"}
        try:
            return str(api.create_container(image, command=C.REAPER_ARGV, working_dir=workdir, user=user,
                                            labels={C.LABEL_RUN: self.run_id, C.LABEL_SANDBOX: sid},
                                            host_config=api.create_host_config(**cfg))["Id"])
        except api_errors() as e:
            raise SubstrateError(f"docker: cannot create a container of {image}: {e}") from e

    def _engine_start(self, cid: str) -> None:
        try:
            self.client.api.start(cid)
        except api_errors() as e:
            raise SubstrateError(f"docker: cannot start container {cid[:12]}: {e}") from e

    def _engine_remove(self, cid: str) -> None:
        with contextlib.suppress(*api_errors()):
            self.client.api.remove_container(cid, force=True)

    def _engine_layer_dirs(self, cid: str) -> tuple[Path, Path]:
        errors: tuple[type[BaseException], ...] = (KeyError, TypeError, *api_errors())
        try:
            data = self.client.api.inspect_container(cid)["GraphDriver"]["Data"]
            return Path(data["UpperDir"]), Path(data["WorkDir"])
        except errors as e:
            raise SubstrateError(f"docker: cannot find the layer folder of {cid[:12]}: {e}") from e

    def _engine_containers(self) -> list[tuple[str, str]]:
        try:
            found = self.client.api.containers(all=True, filters={"label": f"{C.LABEL_RUN}={self.run_id}"})
        except api_errors() as e:
            raise SubstrateError(str(e)) from e
        return [(str(c["Id"]), str(c.get("State", "?"))) for c in found]

    def raw_floor(self) -> list[str] | None:
        """How most harnesses start a sandbox: the CLI, one container per command."""
        return self.raw_floor_of(self.image())

    def raw_floor_of(self, image: str) -> list[str] | None:
        """``docker run --rm`` of ``image`` (a task image too: ``RecipeImages``)."""
        cli = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
        return [cli, "run", "--rm", "--network", "none", image, "true"]

    def close(self, wait_s: float = 60.0) -> None:
        """Remove the containers whose ``destroy`` failed (waiting up to ``wait_s`` for a daemon that
        does not answer), then close the client. What still cannot be removed stays for ``gc``."""
        deadline = time.monotonic() + wait_s
        while self.unremoved and time.monotonic() < deadline:
            for cid, sid in list(self.unremoved.items()):
                C.unbind_disk(self.run_id, sid)
                try:
                    self.client.api.remove_container(cid, force=True)
                except docker.errors.NotFound:
                    pass
                except api_errors():
                    continue
                del self.unremoved[cid]
            if self.unremoved:
                time.sleep(1.0)
        with contextlib.suppress(Exception):
            self.client.close()

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        if not HAVE_SDK or not dead_runs:
            return []
        try:
            client = docker.from_env(version="auto", timeout=30)
            found = client.api.containers(all=True, filters={"label": C.LABEL_RUN})
        except Exception:
            return []
        def remove(cid: str) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(cid, force=True)

        def builds() -> list[str]:
            return [c["Id"] for c in client.api.containers(all=True, filters={"name": C.BUILD_PREFIX})
                    if any(n.lstrip("/").startswith(C.BUILD_PREFIX) for n in c["Names"])]

        removed: list[str] = []
        for run in dead_runs:  # disk-bound tmpfs first (detached; freed as their containers go, one line each)
            C.unbind_disk(run)
        try:
            C.gc_containers("docker", found, dead_runs, remove, builds, removed)
        except api_errors():
            pass
        finally:
            client.close()
        return removed


def main(argv: list[str] | None = None) -> int:
    return C.engine_main(DockerSubstrate, lambda flavor: ensure_image(flavor=flavor), argv)


if __name__ == "__main__":
    sys.exit(main())
