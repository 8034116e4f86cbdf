"""The image recipes of a Harbor task (``substrates.base.ImageRecipe``), read when an image is built.

Contract: ``agent_recipe(spec)`` is the start state: ``environment/`` as the build context and its
Dockerfile with outside bases made this machine's (``dockerfile.read``); a task that names a
``docker_image`` instead gets a one-line recipe from that base. ``verifier_recipe(spec)`` is the
separate verifier's own image as Harbor picks it (``tests/Dockerfile`` with ``tests/`` as the
context), or None when the verifier runs in an image of the agent's recipe. Both read the folder
through ``suite_folders`` (no link out of it, size bounds) and keep the task's build time limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from drumsbench.envs.harbor import dockerfile
from drumsbench.envs.harbor.base_images import BaseImage
from drumsbench.envs.harbor.spec import HarborTaskSpec
from drumsbench.envs.suite_folders import read_tree
from drumsbench.substrates.base import BASE_ARGS, ImageRecipe


def _from_base(base: BaseImage, workdir: str | None, timeout_s: float) -> ImageRecipe:
    text = "".join(f"ARG {a}\n" for a in BASE_ARGS.values()) + "FROM ${" + BASE_ARGS[base.flavor] + "}\n"
    return ImageRecipe(text + (f"WORKDIR {workdir}\n" if workdir else ""), {}, timeout_s)


def _of_folder(spec: HarborTaskSpec, folder: Path) -> ImageRecipe:
    plan = dockerfile.read(folder / "Dockerfile", spec.folder, spec.base.debian)
    context = read_tree(folder, spec.folder)
    executables = frozenset(rel for rel in context if os.access(folder / rel, os.X_OK))
    return ImageRecipe(plan.recipe_text, context, spec.build_timeout_s, executables)


def agent_recipe(spec: HarborTaskSpec) -> ImageRecipe:
    """The task's start state (module contract)."""
    env_dir = spec.folder / "environment"
    if (env_dir / "Dockerfile").is_file():
        return _of_folder(spec, env_dir)
    return _from_base(spec.base, spec.workdir, spec.build_timeout_s)


def verifier_recipe(spec: HarborTaskSpec) -> ImageRecipe | None:
    """Separate mode's own image, or None (module contract)."""
    if spec.verifier_base is None:
        return None
    tests = spec.folder / "tests"
    if (tests / "Dockerfile").is_file():
        return _of_folder(spec, tests)
    return _from_base(spec.verifier_base, spec.workdir, spec.build_timeout_s)
