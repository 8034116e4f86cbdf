"""A Harbor task's own Dockerfile is built on this machine (``RecipeImages`` of the docker substrate):
its outside bases become this machine's Debian images, ``RUN`` reaches the registries, the result is
cached by content, and a failed or slow build leaves nothing under the task's tag."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.errors import ImageBuildError
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.recipe import agent_recipe, verifier_recipe
from drumsbench.envs.harbor.spec import load_specs
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages
from drumsbench.substrates.containers.docker import image_exists

from conftest import require

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"


@pytest.fixture(scope="module")
def docker_sub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecipeImages]:
    require(interpreter.missing())
    cls = registry.get("docker")
    require(cls.missing())
    state = tmp_path_factory.mktemp("state")
    sub = cls("harbor-images", state)
    assert isinstance(sub, RecipeImages)
    yield sub
    sub.close()


def in_image(image: str, script: str) -> str:
    """What ``script`` prints in a throwaway container of ``image``, without network."""
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout


def a_task(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None, timeout: float = 300) -> Path:
    task = tmp_path / "suite" / "t"
    shutil.copytree(EXAMPLES / "count-words", task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).write_text(text)
    toml = (task / "task.toml").read_text().replace("build_timeout_sec = 300.0", f"build_timeout_sec = {timeout}")
    (task / "task.toml").write_text(toml)
    return task


def test_start_state_is_the_dockerfile(docker_sub: RecipeImages, tmp_path: Path) -> None:
    task = a_task(tmp_path, "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY . /app/\nRUN chmod 0600 /app/secret\n",
                  {"run.sh": "#!/bin/sh\necho ran\n", "secret": "s\n", "notes.txt": "a b c\n"})
    (task / "environment" / "run.sh").chmod(0o755)
    (spec,) = load_specs(str(task))
    image = docker_sub.build_recipe(agent_recipe(spec))
    out = in_image(image, "pwd; ./run.sh; stat -c '%a %n' secret notes.txt; cat notes.txt; "
                          ". /etc/os-release; echo $VERSION_CODENAME")
    assert out.split("\n")[:6] == ["/app", "ran", "600 secret", "644 notes.txt", "a b c", "bookworm"], out
    # the context is environment/ as docker build sends it: the task's own Dockerfile, not the recipe
    assert in_image(image, "ls -A /app; cat /app/Dockerfile").split("\n")[:5] == [
        "Dockerfile", "notes.txt", "run.sh", "secret", "FROM debian:bookworm-slim"]
    # cached by content: the same recipe is the same image, built once
    t0 = time.monotonic()
    assert docker_sub.build_recipe(agent_recipe(spec)) == image
    assert time.monotonic() - t0 < 5
    (task / "environment" / "notes.txt").write_text("a b c d\n")
    changed = docker_sub.build_recipe(agent_recipe(load_specs(str(task))[0]))
    assert changed != image and in_image(changed, "cat notes.txt") == "a b c d\n"


def test_python_images_and_the_registries(docker_sub: RecipeImages) -> None:
    """fix-median: python:3.11-slim is Debian's Python with pip free to install; its separate
    verifier image installs pytest from PyPI during the build."""
    spec = {s.id: s for s in load_specs(str(EXAMPLES))}["fix-median"]
    agent = docker_sub.build_recipe(agent_recipe(spec))
    assert in_image(agent, "python --version; python3 -c 'import stats; print(stats.median([1, 2]))'").split() \
        == ["Python", "3.11.2", "2"]
    verifier = verifier_recipe(spec)
    assert verifier is not None
    out = in_image(docker_sub.build_recipe(verifier), "python -m pytest --version; ls /tests 2>&1 | head -1")
    assert "pytest 8.3.3" in out, out


def test_a_failing_step_names_itself_and_leaves_no_image(docker_sub: RecipeImages, tmp_path: Path) -> None:
    task = a_task(tmp_path, "FROM debian:bookworm\nRUN echo starting\nRUN exit 3\n")
    recipe = agent_recipe(load_specs(str(task))[0])
    with pytest.raises(ImageBuildError) as e:
        docker_sub.build_recipe(recipe)
    assert "failed at RUN exit 3:" in str(e.value) and "non-zero code: 3" in str(e.value), e.value
    assert not image_exists(docker_sub.client, f"drumsbench-task:{recipe.digest()[:16]}")  # type: ignore[attr-defined]


def test_a_slow_build_stops_at_its_limit(docker_sub: RecipeImages, tmp_path: Path) -> None:
    """A silent step past ``build_timeout_sec``: the limit, not the step's end, ends the wait; the
    image never appears under the task's tag, not even once the step would have finished."""
    task = a_task(tmp_path, "FROM debian:bookworm\nRUN sleep 12 && touch /slow\n", timeout=3)
    recipe = agent_recipe(load_specs(str(task))[0])
    t0 = time.monotonic()
    with pytest.raises(ImageBuildError, match="time limit"):
        docker_sub.build_recipe(recipe)
    assert time.monotonic() - t0 < 10
    time.sleep(12)
    client = docker_sub.client  # type: ignore[attr-defined]
    assert not image_exists(client, f"drumsbench-task:{recipe.digest()[:16]}")
    assert not [i for i in client.api.images() if any("drumsbench-task-build" in t for t in i.get("RepoTags") or [])]
