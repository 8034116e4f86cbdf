"""Podman's part of building a task's image (``recipe_build``, whose contract holds): ``podman build``
(buildah) with the project's private configuration, ``--network=host``, ``--pull=never``, on the
context written to a folder of podman's own cache (never the host's /tmp), removed after. Past the
limit the build is stopped: SIGTERM to its process group (podman removes its working container),
SIGKILL 10 s later if it is still there."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from drumsbench.core.errors import ImageBuildError
from drumsbench.substrates.containers import recipe_build
from drumsbench.substrates.containers.podman import ensure_rootfs_image, image_exists
from drumsbench.substrates.containers.podman_cli import config_dir, configure, podman, work_dir

STOP_GRACE_S = 10.0


def _write_context(files: Mapping[str, bytes], executables: frozenset[str]) -> Path:
    builds = config_dir() / "builds"
    builds.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ctx-", dir=builds))
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if rel in executables else 0o644)
        os.utime(path, (0, 0))
    return folder


def _read_lines(proc: subprocess.Popen[bytes], into: list[str]) -> None:
    """Every line ``proc`` prints, until it closes its output."""
    if proc.stdout is not None:
        for raw in iter(proc.stdout.readline, b""):
            into.append(raw.decode(errors="replace"))


class PodmanEngine:
    """``recipe_build.Engine`` through the podman CLI."""

    name = "podman"

    def exists(self, tag: str) -> bool:
        return image_exists(tag)

    def rootfs(self) -> str:
        return ensure_rootfs_image()

    def run_build(self, tag: str, files: Mapping[str, bytes], buildargs: dict[str, str], timeout_s: float,
                  executables: frozenset[str], log: recipe_build.BuildLog) -> None:
        exe = shutil.which("podman")
        if exe is None:
            raise ImageBuildError("podman: not installed: apt-get install podman (or run scripts/setup.sh)")
        folder = _write_context(files, executables)
        argv = [exe, "--log-level=error", "build", "--network=host", "--pull=never", "--layers",
                "-f", str(folder / recipe_build.RECIPE_NAME), "-t", tag,
                *(a for k, v in sorted(buildargs.items()) for a in ("--build-arg", f"{k}={v}")), str(folder)]
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=configure(),
                                    cwd=work_dir(), start_new_session=True)
            lines: list[str] = []
            reader = threading.Thread(target=_read_lines, args=(proc, lines), daemon=True)
            reader.start()
            try:
                proc.wait(timeout=max(log.deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self._stop(proc)
                reader.join(timeout=5)
                for line in lines:
                    log.line(line)
                raise log.over() from None
            reader.join(timeout=30)
            for line in lines:
                log.line(line)
            if proc.returncode != 0:
                raise log.failed(log.tail[-1] if log.tail else f"podman build exited {proc.returncode}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def retag(self, source: str, tag: str) -> None:
        proc = podman(["tag", source, tag], check=False)
        if proc.returncode != 0:
            raise ImageBuildError(f"podman: cannot name the built image {tag}: {proc.stderr.decode(errors='replace')}")

    def remove(self, tag: str) -> None:
        podman(["rmi", "--force", tag], check=False, timeout=120)
