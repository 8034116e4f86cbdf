"""What DrumsBench reads from a Harbor task's ``environment/Dockerfile`` before anything is built.

Parsed with BuildKit's own parser (the ``dockerfile`` package), so line continuations, JSON forms
and heredocs are read as Docker reads them. Contract of ``read(path, root, suite)``: a
``DockerfilePlan`` — the final stage's base image (``base_images.resolve``, followed through
``FROM <earlier stage>``), its last ``WORKDIR`` (the agent's working folder; relative ones joined
as Docker does), and the recipe's text (each ``FROM`` of an outside image made the build argument of
the base it resolved to, ``substrates.base.ImageRecipe``) — or a one-line ``UsageError`` naming
the file, the line and the fix, for: a file that does not parse, no ``FROM``, a ``FROM`` or
``COPY --from=`` that names an image this machine cannot have, a build argument in ``FROM``
without a default.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import dockerfile
from pydantic import BaseModel, ConfigDict

from drumsbench.core.errors import UsageError
from drumsbench.envs.harbor.base_images import BaseImage, resolve
from drumsbench.envs.suite_folders import read_text
from drumsbench.substrates.base import BASE_ARGS

_ARG = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class DockerfilePlan(BaseModel):
    """The start state's recipe as far as DrumsBench reads it (module contract)."""

    model_config = ConfigDict(frozen=True)

    base: BaseImage
    workdir: str | None  # the final stage's last WORKDIR; None: the image's (/)
    stages: int
    # the Dockerfile with every FROM of an outside image made this machine's base (``ImageRecipe``)
    recipe_text: str


def _expand(value: str, args: dict[str, str], where: str) -> str:
    """``value`` with ``$NAME``, ``${NAME}`` and ``${NAME:-default}`` of the global build arguments
    replaced; an argument with no value is refused (the image would depend on the build command)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in args:
            return args[name]
        if m.group(2) is not None:
            return m.group(2)
        raise UsageError(f"{where}: build argument {name} has no default; give it one "
                         f"(ARG {name}=...) before the first FROM")

    return _ARG.sub(sub, value)


def read(path: Path, root: Path, suite: str) -> DockerfilePlan:
    """The plan of the Dockerfile at ``path`` inside the task folder ``root`` (module contract)."""
    text = read_text(path, root)
    try:
        commands = dockerfile.parse_string(text)
    except dockerfile.GoParseError as e:
        raise UsageError(f"{path}: does not parse ({' '.join(str(e).split())}); fix the Dockerfile") from None
    global_args: dict[str, str] = {}
    stages: dict[str, BaseImage] = {}  # stage name -> its root base
    base: BaseImage | None = None
    workdir: str | None = None
    lines = text.splitlines(keepends=True)
    for c in commands:
        where = f"{path}:{c.start_line}"
        if c.cmd == "ARG" and base is None:
            for item in c.value:
                name, eq, default = item.partition("=")
                if eq:
                    global_args[name] = default.strip("\"'")
        elif c.cmd == "FROM":
            ref = _expand(c.value[0], global_args, f"{where}: FROM")
            if ref.lower() in stages:
                base = stages[ref.lower()]
            else:
                base = resolve(ref, suite, f"{where}: FROM")
                i = c.start_line - 1
                lines[i] = lines[i].replace(c.value[0], "${" + BASE_ARGS[base.flavor] + "}", 1)
            workdir = None
            if len(c.value) >= 3 and c.value[1].upper() == "AS":
                stages[c.value[2].lower()] = base
        elif c.cmd in ("COPY", "ADD"):
            for flag in c.flags:
                if flag.startswith("--from="):
                    src = flag[len("--from="):]
                    if src.lower() not in stages and not src.isdigit():
                        resolve(src, suite, f"{where}: {c.cmd} --from")
        elif c.cmd == "WORKDIR" and c.value:
            workdir = posixpath.normpath(posixpath.join(workdir or "/", c.value[0]))
    if base is None:
        raise UsageError(f"{path}: no FROM line; a Dockerfile starts from a base image (see docs/harbor.md)")
    declared = "".join(f"ARG {arg}\n" for arg in BASE_ARGS.values())
    return DockerfilePlan(base=base, workdir=workdir, stages=sum(1 for c in commands if c.cmd == "FROM"),
                          recipe_text=declared + "".join(lines))
