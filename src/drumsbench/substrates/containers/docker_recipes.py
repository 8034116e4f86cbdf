"""Docker builds a task's own image from an ``ImageRecipe`` (``RecipeImages`` of the docker substrate).

Contract of ``build(client, recipe)``: the tag ``drumsbench-task:<digest 16>`` of the recipe's image,
built by dockerd's builder when absent (under a lock per digest, so concurrent callers build once)
and reused after. The bases are this machine's (``ensure_bases``): ``DRUMSBENCH_BASE_DEBIAN`` is
the Debian rootfs image (``images.rootfs_tag()``) trusting this machine's own certificate
authorities (``HOST_CAS``: where its registries are reached through a proxy that signs with one);
``DRUMSBENCH_BASE_PYTHON`` is that plus Debian's
Python 3, pip and venv with Debian's "externally managed" marker removed and ``python`` a name of
``python3``, as the python images have it (``drumsbench-base-python:<hash>``). Nothing is pulled
(``pull=False``: every ``FROM`` is one of these or an earlier stage). ``RUN`` steps get the host's
network (``network_mode=host``), so that they reach the package registries this machine reaches;
only the task's recipe runs there, never the policy. A failed step or a build past
``recipe.timeout_s`` is an ``ImageBuildError`` with the step and the builder's last lines; a
failed build leaves no image under the tag (dockerd tags only a complete build).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import urllib3.exceptions

from drumsbench.core.errors import ImageBuildError
from drumsbench.substrates.base import BASE_ARGS, ImageRecipe
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.containers.docker import ensure_rootfs_image, image_exists
from drumsbench.substrates.containers.docker_sandbox import api_errors

HOST_CAS = Path("/usr/local/share/ca-certificates")  # this machine's own certificate authorities
DEBIAN_RECIPE = (
    "ARG ROOTFS\n"
    "FROM ${ROOTFS}\n"
    "COPY cas/ /usr/local/share/ca-certificates/\n"
    "RUN update-ca-certificates >/dev/null 2>&1 || true\n"
)
PYTHON_PACKAGES = ("python3-pip", "python3-venv", "python-is-python3")
PYTHON_RECIPE = (
    "ARG DRUMSBENCH_BASE_DEBIAN\n"
    "FROM ${DRUMSBENCH_BASE_DEBIAN}\n"
    "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
    f"{' '.join(PYTHON_PACKAGES)} >/dev/null && rm -rf /var/lib/apt/lists/* "
    "&& rm -f /usr/lib/python3*/EXTERNALLY-MANAGED\n"
)
TAIL_LINES = 8
URLLIB3_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError,)  # a read timeout, unwrapped
RECIPE_NAME = ".drumsbench.Dockerfile"  # the recipe's name in the context sent to dockerd
BUILD_REPO = "drumsbench-task-build"  # a build's own name until it is complete


def _context_tar(files: Mapping[str, bytes], executables: frozenset[str]) -> io.BytesIO:
    """The build context as a tar: every file 0644 (0755 when listed in ``executables``), time 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(files[rel]), 0o755 if rel in executables else 0o644, 0
            tar.addfile(info, io.BytesIO(files[rel]))
    buf.seek(0)
    return buf


def _with_recipe(files: Mapping[str, bytes], dockerfile: str) -> dict[str, bytes]:
    """The context sent to dockerd: ``files`` untouched (a ``COPY .`` copies what ``docker build``
    would, the task's own Dockerfile included) plus the recipe as ``RECIPE_NAME``, which a
    ``.dockerignore`` line keeps out of every ``COPY`` (the task's own ``.dockerignore`` is kept, the
    line appended; one made here ignores itself too). dockerd reads both all the same."""
    own = files.get(".dockerignore")
    ignore = (own + b"\n" if own is not None else b".dockerignore\n") + RECIPE_NAME.encode() + b"\n"
    return {**files, RECIPE_NAME: dockerfile.encode(), ".dockerignore": ignore}


def _run_build(client: Any, tag: str, dockerfile: str, files: Mapping[str, bytes], buildargs: dict[str, str],
               timeout_s: float, executables: frozenset[str] = frozenset()) -> None:
    """One ``docker build`` of ``dockerfile`` in the context ``files`` tagged ``tag``;
    ``ImageBuildError`` on a failed step or past ``timeout_s``. The build is tagged under a name of
    its own first and given ``tag`` only once complete, so a build that goes on after its caller
    gave up (dockerd does not always stop one when the client hangs up) never appears under ``tag``."""
    deadline = time.monotonic() + timeout_s
    scratch = f"{BUILD_REPO}:{uuid.uuid4().hex[:16]}"
    tail: list[str] = []
    step = ""

    def over() -> ImageBuildError:
        return ImageBuildError(f"image build passed its time limit ({timeout_s:.0f} s) at {step or 'the start'}; "
                               "raise [environment] build_timeout_sec", step)

    try:
        stream = client.api.build(fileobj=_context_tar(_with_recipe(files, dockerfile), executables),
                                  custom_context=True, dockerfile=RECIPE_NAME, tag=scratch,
                                  buildargs=buildargs, network_mode="host", pull=False, rm=True, forcerm=True,
                                  decode=True, timeout=timeout_s + 1.0)  # a silent step: the read times out
        try:
            for chunk in stream:
                text = str(chunk.get("stream") or chunk.get("status") or "")
                for line in text.splitlines():
                    if line.strip():
                        tail = [*tail, line.strip()][-TAIL_LINES:]
                        if line.startswith("Step ") and " : " in line:  # "Step 3/5 : RUN ...": numbered
                            step = line.split(" : ", 1)[1].strip()    # with the recipe's own ARG lines
                if "error" in chunk:
                    detail = " ".join(str(chunk.get("error")).split())
                    raise ImageBuildError(f"image build failed at {step or 'the start'}: {detail} "
                                          f"(last lines: {' | '.join(tail)[-600:]})", step)
                if time.monotonic() > deadline:
                    raise over()
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        if not image_exists(client, scratch):
            raise ImageBuildError(f"image build of {tag} ended without an image (last lines: {' | '.join(tail)})",
                                  step)
        repo, _, name = tag.partition(":")
        client.api.tag(scratch, repo, name)
    except (*api_errors(), *URLLIB3_ERRORS) as e:
        if time.monotonic() > deadline:
            raise over() from None
        raise ImageBuildError(f"image build failed at {step or 'the start'}: dockerd: {e}", step) from e
    finally:
        with contextlib.suppress(*api_errors()):
            client.api.remove_image(scratch, noprune=False)


def _host_cas() -> dict[str, bytes]:
    """This machine's own certificate authorities (``HOST_CAS``), as ``cas/<name>.crt``."""
    if not HOST_CAS.is_dir():
        return {}
    return {f"cas/{p.name}": p.read_bytes() for p in sorted(HOST_CAS.glob("*.crt")) if p.is_file()}


def _ensure_base(client: Any, name: str, recipe: str, files: dict[str, bytes], buildargs: dict[str, str],
                 what: str) -> str:
    """``drumsbench-base-<name>:<hash of its inputs>``, built once."""
    h = hashlib.sha256(f"{recipe}|{sorted(buildargs.items())}".encode())
    for rel in sorted(files):
        h.update(rel.encode() + hashlib.sha256(files[rel]).digest())
    tag = f"drumsbench-base-{name}:{h.hexdigest()[:12]}"
    if not image_exists(client, tag):
        with C.build_lock(f"docker-base-{name}"):
            if not image_exists(client, tag):
                C.progress(f"docker: building {tag} ({what}; once)")
                _run_build(client, tag, recipe, files, buildargs, timeout_s=900)
    return tag


def ensure_bases(client: Any) -> dict[str, str]:
    """The build arguments every recipe gets: ``BASE_ARGS`` name -> this machine's image (module contract)."""
    with C.build_lock("docker-image"):
        rootfs = ensure_rootfs_image(client)
    debian = _ensure_base(client, "debian", DEBIAN_RECIPE, {"cas/.keep": b"", **_host_cas()}, {"ROOTFS": rootfs},
                          "the Debian rootfs with this machine's certificate authorities")
    python = _ensure_base(client, "python", PYTHON_RECIPE, {}, {BASE_ARGS["debian"]: debian},
                          "Debian's Python, pip and venv")
    return {BASE_ARGS["debian"]: debian, BASE_ARGS["python"]: python}


def build(client: Any, recipe: ImageRecipe) -> str:
    """The image of ``recipe`` (module contract)."""
    tag = f"drumsbench-task:{recipe.digest()[:16]}"
    if image_exists(client, tag):
        return tag
    buildargs = ensure_bases(client)
    with C.build_lock(f"docker-task-{recipe.digest()[:16]}"):
        if image_exists(client, tag):
            return tag
        t0 = time.monotonic()
        C.progress(f"docker: building the task image {tag}")
        _run_build(client, tag, recipe.dockerfile, recipe.context, buildargs, recipe.timeout_s, recipe.executables)
        C.progress(f"docker: {tag} ready ({time.monotonic() - t0:.1f} s)")
    return tag
