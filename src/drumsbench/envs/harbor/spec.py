"""A Harbor task folder as DrumsBench reads it: Harbor's own models first, then stricter checks.

Contract of ``load_specs(path)``: ``path`` is one Harbor task folder (it holds ``task.toml``) or a
folder of them (``*/task.toml``). Every folder passes, in this order, or the whole load stops with
one ``UsageError`` line naming the folder or file and the fix:

1. the checks every suite folder passes (``suite_folders``): nothing in it is a link leaving it
   (``tests/`` linked elsewhere, a test file linked to the host), a dangling link or a special file,
   and ``task.toml`` is readable UTF-8 TOML;
2. Harbor's own ``Task(folder)`` (run by Harbor's interpreter, ``interpreter.parse``): a folder
   Harbor refuses is refused with Harbor's reason;
3. what Harbor leaves unchecked and DrumsBench needs: ``solution/solve.sh`` (the oracle: every task
   is proved by oracle 1 / nop 0), one ``environment/Dockerfile`` (no compose: nothing here runs
   several containers) whose base image can be had here (``dockerfile.read``), a single-step
   Linux task with no GPU or TPU.

The result is sorted by id (the folder name, lowercased, other characters made ``-``); ids are
unique. A task's wish for network (``network_mode``/``allow_internet``) is kept in ``network_asked``:
DrumsBench's sandboxes have no network whatever a task asks (docs/harbor.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from drumsbench import images
from drumsbench.core.errors import UsageError
from drumsbench.envs.harbor import dockerfile, interpreter
from drumsbench.envs.harbor.base_images import BaseImage, resolve
from drumsbench.envs.suite_folders import check_folder, read_toml, task_folders

DOC = "docs/harbor.md"


class HarborTaskSpec(BaseModel):
    """One Harbor task, read and checked (module contract). Times in seconds; None: not given."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str  # Harbor's name ([task] name, else the folder's)
    folder: Path
    instruction: str
    base: BaseImage
    workdir: str | None  # the Dockerfile's last WORKDIR, or [environment] workdir
    agent_timeout_s: float | None
    verifier_timeout_s: float
    build_timeout_s: float
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    verifier_mode: str  # "shared" (Harbor verifies in the agent's container) or "separate"
    verifier_base: BaseImage | None  # separate mode's own image (tests/Dockerfile, [verifier.environment])
    network_asked: str  # Harbor's network_mode ("public", "no-network", ...); DrumsBench gives none
    env: dict[str, str]
    metadata: dict[str, Any]  # [metadata]: free-form in Harbor; DrumsBench reads ``drumsbench_carry``


def task_id(folder: Path) -> str:
    """The id of the task in ``folder``: its name, lowercased, other characters made ``-``."""
    return re.sub(r"[^a-z0-9-]+", "-", folder.name.lower()).strip("-") or "task"


def _folders(path: str) -> list[Path]:
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"--tasks harbor:{path}: not a folder; give a Harbor task folder or a folder of them")
    if (root / "task.toml").exists():
        check_folder(root, root)
        read_toml(root / "task.toml", root)
        return [root]
    return task_folders(root, DOC)


def _verifier_base(folder: Path, verifier: dict[str, Any], suite: str) -> BaseImage | None:
    """Separate mode's own image, as Harbor picks it: ``[verifier.environment] docker_image``, else
    ``tests/Dockerfile``; None: the task's image (Harbor's fallback)."""
    image = (verifier.get("environment") or {}).get("docker_image")
    if image:
        return resolve(str(image), suite, f"{folder}/task.toml: [verifier.environment] docker_image =")
    tests_docker = folder / "tests" / "Dockerfile"
    if tests_docker.is_file():
        return dockerfile.read(tests_docker, folder, suite).base
    if (folder / "tests" / "docker-compose.yaml").is_file():
        raise UsageError(f"{folder}/tests/docker-compose.yaml: several containers; give one tests/Dockerfile "
                         f"(see {DOC})")
    return None


def _spec(folder: Path, answer: dict[str, Any], suite: str) -> HarborTaskSpec:
    if not answer.get("ok"):
        raise UsageError(f"{folder}: Harbor refuses this task: {answer.get('reason', '?')}")
    cfg: dict[str, Any] = answer["config"]
    env_cfg: dict[str, Any] = cfg.get("environment") or {}
    if answer.get("has_steps"):
        raise UsageError(f"{folder}/task.toml: [[steps]]: multi-step tasks are not supported yet; give one step")
    if env_cfg.get("os", "linux") != "linux":
        raise UsageError(f"{folder}/task.toml: [environment] os = {env_cfg.get('os')!r}: only linux tasks run here")
    if env_cfg.get("gpus") or env_cfg.get("tpu"):
        raise UsageError(f"{folder}/task.toml: [environment] gpus/tpu: this machine has none; remove them")
    solve = folder / "solution" / "solve.sh"
    if not solve.is_file():
        raise UsageError(f"{solve}: missing; every task needs its oracle (DrumsBench proves each task: "
                         "oracle scores 1, nop scores 0)")
    docker = folder / "environment" / "Dockerfile"
    workdir: str | None = env_cfg.get("workdir")
    if env_cfg.get("docker_image"):
        base = resolve(str(env_cfg["docker_image"]), suite, f"{folder}/task.toml: [environment] docker_image =")
    elif docker.is_file():
        plan = dockerfile.read(docker, folder, suite)
        base, workdir = plan.base, workdir or plan.workdir
    else:
        composed = sorted(p.name for p in (folder / "environment").glob("*compose*.y*ml"))
        what = f"{composed[0]} (several containers)" if composed else "no Dockerfile"
        raise UsageError(f"{folder}/environment: {what}; give one environment/Dockerfile (see {DOC})")
    verifier: dict[str, Any] = cfg.get("verifier") or {}
    agent: dict[str, Any] = cfg.get("agent") or {}
    for phase, table in (("agent", agent), ("verifier", verifier)):
        if table.get("user") is not None:
            raise UsageError(f"{folder}/task.toml: [{phase}] user = {table['user']!r}: DrumsBench runs the {phase} as "
                             "the image's USER only; remove it, or end the Dockerfile with that USER")
    mode = str(verifier.get("environment_mode") or ("separate" if verifier.get("environment") else "shared"))
    verifier_base = _verifier_base(folder, verifier, suite) if mode == "separate" else None
    network = str(env_cfg.get("network_mode") or "public")  # Harbor folds allow_internet into it
    return HarborTaskSpec(
        id=task_id(folder), name=str(answer.get("name") or folder.name), folder=folder,
        instruction=str(answer.get("instruction") or ""), base=base, workdir=workdir,
        agent_timeout_s=agent.get("timeout_sec"), verifier_timeout_s=float(verifier.get("timeout_sec", 600.0)),
        build_timeout_s=float(env_cfg.get("build_timeout_sec", 600.0)), cpus=env_cfg.get("cpus"),
        memory_mb=env_cfg.get("memory_mb"), storage_mb=env_cfg.get("storage_mb"),
        verifier_mode=mode, verifier_base=verifier_base, network_asked=network,
        env={str(k): str(v) for k, v in (env_cfg.get("env") or {}).items()},
        metadata=dict(cfg.get("metadata") or {}))


def load_specs(path: str) -> tuple[HarborTaskSpec, ...]:
    """Every Harbor task under ``path``, checked (module contract)."""
    folders = _folders(path)
    suite = images.host_suite()
    specs = [_spec(f, a, suite) for f, a in zip(folders, interpreter.parse(folders), strict=True)]
    seen: dict[str, Path] = {}
    for s in specs:
        if s.id in seen:
            raise UsageError(f"{s.folder}: task id {s.id!r} is also {seen[s.id]}'s; rename one folder")
        seen[s.id] = s.folder
    return tuple(sorted(specs, key=lambda s: s.id))
