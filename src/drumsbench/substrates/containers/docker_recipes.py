"""Docker's part of building a task's image (``recipe_build``, whose contract holds): dockerd's
builder through the SDK, the context sent as a tar (every file 0644, 0755 when executable, time 0),
``network_mode=host``, ``pull=False``. A silent step past the limit ends the wait by the socket's
read timeout; closing the stream makes dockerd stop the build."""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Mapping
from typing import Any

import urllib3.exceptions

from drumsbench.core.errors import ImageBuildError
from drumsbench.substrates.containers import recipe_build
from drumsbench.substrates.containers.docker import ensure_rootfs_image, image_exists
from drumsbench.substrates.containers.docker_sandbox import api_errors

# a read timeout comes from urllib3 unwrapped
_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError,)


def context_tar(files: Mapping[str, bytes], executables: frozenset[str]) -> io.BytesIO:
    """The build context as a tar: every file 0644 (0755 when listed in ``executables``), time 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(files[rel]), 0o755 if rel in executables else 0o644, 0
            tar.addfile(info, io.BytesIO(files[rel]))
    buf.seek(0)
    return buf


class DockerEngine:
    """``recipe_build.Engine`` on one SDK client."""

    name = "docker"

    def __init__(self, client: Any) -> None:
        self.client = client

    def exists(self, tag: str) -> bool:
        return image_exists(self.client, tag)

    def rootfs(self) -> str:
        return ensure_rootfs_image(self.client)

    def run_build(self, tag: str, files: Mapping[str, bytes], buildargs: dict[str, str], timeout_s: float,
                  executables: frozenset[str], log: recipe_build.BuildLog) -> None:
        try:
            stream = self.client.api.build(
                fileobj=context_tar(files, executables), custom_context=True, dockerfile=recipe_build.RECIPE_NAME,
                tag=tag, buildargs=buildargs, network_mode="host", pull=False, rm=True, forcerm=True, decode=True,
                timeout=timeout_s + 1.0)  # a silent step: the read times out
            try:
                for chunk in stream:
                    for line in str(chunk.get("stream") or chunk.get("status") or "").splitlines():
                        log.line(line)
                    if "error" in chunk:
                        raise log.failed(str(chunk.get("error")))
                    if log.expired():
                        raise log.over()
            finally:
                close = getattr(stream, "close", None)
                if callable(close):
                    close()
        except (*api_errors(), *_ERRORS) as e:
            if log.expired():
                raise log.over() from None
            raise log.failed(f"dockerd: {e}") from e

    def retag(self, source: str, tag: str) -> None:
        repo, _, name = tag.partition(":")
        try:
            self.client.api.tag(source, repo, name)
        except api_errors() as e:
            raise ImageBuildError(f"docker: cannot name the built image {tag}: {e}") from e

    def remove(self, tag: str) -> None:
        with contextlib.suppress(*api_errors()):
            self.client.api.remove_image(tag, noprune=False)
