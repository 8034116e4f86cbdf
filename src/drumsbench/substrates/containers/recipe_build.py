"""Building a task's own image from an ``ImageRecipe``: what both engines share (``RecipeImages``).

Contract of ``build(engine, recipe)``: the tag ``drumsbench-task:<digest 16>`` of the recipe's
image, built by the engine when absent (under a lock per digest, so concurrent callers build once)
and reused after. The bases are this machine's (``ensure_bases``): ``DRUMSBENCH_BASE_DEBIAN`` is
the Debian rootfs image (``images.rootfs_tag()``) trusting this machine's own certificate
authorities (``HOST_CAS``: its registries are reached through a proxy that signs with one);
``DRUMSBENCH_BASE_PYTHON`` is that plus Debian's Python 3, pip and venv with Debian's "externally
managed" marker removed and ``python`` a name of ``python3``, as the python images have it. Nothing
is pulled (every ``FROM`` is one of these or an earlier stage). ``RUN`` steps get the host's network,
so that they reach the package registries this machine reaches; only the task's recipe runs there,
never the policy (docs/harbor.md: the trust this takes). The context an engine is given is the
recipe's files untouched plus the recipe as ``RECIPE_NAME``, which ``.dockerignore`` keeps out of
every ``COPY`` (``with_recipe``). A build is tagged under a name of its own (``BUILD_REPO``) and
given the task's tag only once complete, so a build that goes on after its caller gave up never
appears under it. A failed step or a build past ``recipe.timeout_s`` is an ``ImageBuildError``
naming the instruction (``BuildLog``) with the builder's last lines.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from drumsbench.core.errors import ImageBuildError
from drumsbench.substrates.base import BASE_ARGS, ImageRecipe
from drumsbench.substrates.containers import common as C

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
RECIPE_NAME = ".drumsbench.Dockerfile"  # the recipe's name in the context an engine is given
BUILD_REPO = "drumsbench-task-build"  # a build's own name until it is complete
BASE_TIMEOUT_S = 900.0
TAIL_LINES = 8
# a step as the builders print it: docker "Step 3/5 : RUN ...", podman (buildah) "STEP 3/5: RUN ..."
_STEP = re.compile(r"^(?:Step|STEP) \d+/\d+ ?: (.*)$")


class Engine(Protocol):
    """What ``build`` needs of a container engine."""

    name: str

    def exists(self, tag: str) -> bool: ...

    def rootfs(self) -> str:
        """The Debian rootfs as a plain image (no sandbox layer), imported first when absent."""
        ...

    def run_build(self, tag: str, files: Mapping[str, bytes], buildargs: dict[str, str], timeout_s: float,
                  executables: frozenset[str], log: BuildLog) -> None:
        """One build of ``files[RECIPE_NAME]`` in the context ``files``, tagged ``tag``, with the host's
        network and no pull; each output line goes to ``log.line``; ``log.failed``/``log.over``
        make the errors. The image exists under ``tag`` when it returns."""
        ...

    def retag(self, source: str, tag: str) -> None: ...

    def remove(self, tag: str) -> None:
        """Remove the image name ``tag`` (best effort; the name may not exist)."""
        ...


class BuildLog:
    """A build's output as far as its errors need it: the current instruction and the last lines."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.step = ""
        self.tail: list[str] = []

    def line(self, text: str) -> None:
        text = text.strip()
        if not text:
            return
        self.tail = [*self.tail, text][-TAIL_LINES:]
        m = _STEP.match(text)
        if m:  # numbered with the recipe's own ARG lines: the instruction alone names it
            self.step = m.group(1).strip()

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def failed(self, detail: str) -> ImageBuildError:
        return ImageBuildError(f"image build failed at {self.step or 'the start'}: {' '.join(detail.split())} "
                               f"(last lines: {' | '.join(self.tail)[-600:]})", self.step)

    def over(self) -> ImageBuildError:
        return ImageBuildError(f"image build passed its time limit ({self.timeout_s:.0f} s) at "
                               f"{self.step or 'the start'}; raise [environment] build_timeout_sec", self.step)


def with_recipe(files: Mapping[str, bytes], dockerfile: str) -> dict[str, bytes]:
    """The context an engine is given (module contract): ``files`` untouched (a ``COPY .`` copies
    what ``docker build`` would, the task's own Dockerfile included) plus the recipe; the task's own
    ``.dockerignore`` is kept with a line appended, one made here ignores itself too."""
    own = files.get(".dockerignore")
    ignore = (own + b"\n" if own is not None else b".dockerignore\n") + RECIPE_NAME.encode() + b"\n"
    return {**files, RECIPE_NAME: dockerfile.encode(), ".dockerignore": ignore}


def _build_as(engine: Engine, tag: str, dockerfile: str, files: Mapping[str, bytes], buildargs: dict[str, str],
              timeout_s: float, executables: frozenset[str] = frozenset()) -> None:
    """Build under a scratch name, then give it ``tag`` (module contract)."""
    scratch = f"{BUILD_REPO}:{uuid.uuid4().hex[:16]}"
    log = BuildLog(timeout_s)
    try:
        engine.run_build(scratch, with_recipe(files, dockerfile), buildargs, timeout_s, executables, log)
        if not engine.exists(scratch):
            raise ImageBuildError(f"image build of {tag} ended without an image (last lines: "
                                  f"{' | '.join(log.tail)})", log.step)
        engine.retag(scratch, tag)
    finally:
        engine.remove(scratch)


def host_cas() -> dict[str, bytes]:
    """This machine's own certificate authorities (``HOST_CAS``), as ``cas/<name>.crt``."""
    if not HOST_CAS.is_dir():
        return {}
    return {f"cas/{p.name}": p.read_bytes() for p in sorted(HOST_CAS.glob("*.crt")) if p.is_file()}


def _ensure_base(engine: Engine, name: str, recipe: str, files: dict[str, bytes], buildargs: dict[str, str],
                 what: str) -> str:
    """``drumsbench-base-<name>:<hash of its inputs>``, built once."""
    h = hashlib.sha256(f"{recipe}|{sorted(buildargs.items())}".encode())
    for rel in sorted(files):
        h.update(rel.encode() + hashlib.sha256(files[rel]).digest())
    tag = f"drumsbench-base-{name}:{h.hexdigest()[:12]}"
    if not engine.exists(tag):
        with C.build_lock(f"{engine.name}-base-{name}"):
            if not engine.exists(tag):
                C.progress(f"{engine.name}: building {tag} ({what}; once)")
                _build_as(engine, tag, recipe, files, buildargs, BASE_TIMEOUT_S)
    return tag


def ensure_bases(engine: Engine) -> dict[str, str]:
    """The build arguments every recipe gets: ``BASE_ARGS`` name -> this machine's image (module contract)."""
    with C.build_lock(f"{engine.name}-image"):
        rootfs = engine.rootfs()
    debian = _ensure_base(engine, "debian", DEBIAN_RECIPE, {"cas/.keep": b"", **host_cas()}, {"ROOTFS": rootfs},
                          "the Debian rootfs with this machine's certificate authorities")
    python = _ensure_base(engine, "python", PYTHON_RECIPE, {}, {BASE_ARGS["debian"]: debian},
                          "Debian's Python, pip and venv")
    return {BASE_ARGS["debian"]: debian, BASE_ARGS["python"]: python}


def build(engine: Engine, recipe: ImageRecipe) -> str:
    """The image of ``recipe`` (module contract)."""
    digest = recipe.digest()[:16]
    tag = f"drumsbench-task:{digest}"
    if engine.exists(tag):
        return tag
    buildargs = ensure_bases(engine)
    with C.build_lock(f"{engine.name}-task-{digest}"):
        if engine.exists(tag):
            return tag
        t0 = time.monotonic()
        C.progress(f"{engine.name}: building the task image {tag}")
        _build_as(engine, tag, recipe.dockerfile, recipe.context, buildargs, recipe.timeout_s, recipe.executables)
        C.progress(f"{engine.name}: {tag} ready ({time.monotonic() - t0:.1f} s)")
    return tag
