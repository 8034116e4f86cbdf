"""A Harbor task's own Dockerfile is built on this machine (``RecipeImages`` of the docker and podman
substrates): its outside bases become this machine's Debian images, ``RUN`` reaches the registries,
the result is cached by content, and a failed or slow build leaves nothing under the task's tag."""

from __future__ import annotations

import re
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
from drumsbench.substrates.containers.docker_recipes import DockerEngine
from drumsbench.substrates.containers.podman_cli import podman
from drumsbench.substrates.containers.podman_recipes import PodmanEngine
from drumsbench.substrates.containers.recipe_build import Engine

from conftest import require

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"


@pytest.fixture(scope="module", params=["docker", "podman"])
def sub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecipeImages]:
    require(interpreter.missing())
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls("harbor-images", tmp_path_factory.mktemp("state"))
    assert isinstance(s, RecipeImages)
    yield s
    s.close()


def engine(sub: RecipeImages) -> Engine:
    return DockerEngine(sub.client) if sub.name == "docker" else PodmanEngine()


def in_image(sub: RecipeImages, image: str, script: str) -> str:
    """What ``script`` prints in a throwaway container of ``image``, without network."""
    argv = ["run", "--rm", "--network", "none", image, "sh", "-c", script]
    if sub.name == "podman":
        return podman(argv, timeout=120).stdout.decode()
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=120, check=True).stdout


def image_names(sub: RecipeImages) -> list[str]:
    if sub.name == "podman":
        return podman(["images", "--format", "{{.Repository}}:{{.Tag}}"]).stdout.decode().split()
    return [t for i in sub.client.api.images() for t in i.get("RepoTags") or []]


def a_task(tmp_path: Path, dockerfile: str, files: dict[str, str] | None = None, timeout: float = 300) -> Path:
    task = tmp_path / "suite" / "t"
    shutil.copytree(EXAMPLES / "count-words", task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).write_text(text)
    toml = (task / "task.toml").read_text().replace("build_timeout_sec = 300.0", f"build_timeout_sec = {timeout}")
    (task / "task.toml").write_text(toml)
    return task


def test_start_state_is_the_dockerfile(sub: RecipeImages, tmp_path: Path) -> None:
    task = a_task(tmp_path, "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY . /app/\nRUN chmod 0600 /app/secret\n",
                  {"run.sh": "#!/bin/sh\necho ran\n", "secret": "s\n", "notes.txt": "a b c\n"})
    (task / "environment" / "run.sh").chmod(0o755)
    (spec,) = load_specs(str(task))
    image = sub.build_recipe(agent_recipe(spec))
    out = in_image(sub, image, "pwd; ./run.sh; stat -c '%a %n' secret notes.txt; cat notes.txt; "
                          ". /etc/os-release; echo $VERSION_CODENAME")
    assert out.split("\n")[:6] == ["/app", "ran", "600 secret", "644 notes.txt", "a b c", "bookworm"], out
    # the context is environment/ as docker build sends it: the task's own Dockerfile, not the recipe
    assert in_image(sub, image, "ls -A /app; cat /app/Dockerfile").split("\n")[:5] == [
        "Dockerfile", "notes.txt", "run.sh", "secret", "FROM debian:bookworm-slim"]
    # cached by content: the same recipe is the same image, built once
    t0 = time.monotonic()
    assert sub.build_recipe(agent_recipe(spec)) == image
    assert time.monotonic() - t0 < 5
    (task / "environment" / "notes.txt").write_text("a b c d\n")
    changed = sub.build_recipe(agent_recipe(load_specs(str(task))[0]))
    assert changed != image and in_image(sub, changed, "cat notes.txt") == "a b c d\n"


def test_python_images_and_the_registries(sub: RecipeImages) -> None:
    """fix-median: python:3.11-slim is Debian's Python with pip free to install; its separate
    verifier image installs pytest from PyPI during the build."""
    spec = {s.id: s for s in load_specs(str(EXAMPLES))}["fix-median"]
    agent = sub.build_recipe(agent_recipe(spec))
    assert in_image(sub, agent, "python --version; python3 -c 'import stats; print(stats.median([1, 2]))'").split() \
        == ["Python", "3.11.2", "2"]
    verifier = verifier_recipe(spec)
    assert verifier is not None
    out = in_image(sub, sub.build_recipe(verifier), "python -m pytest --version; ls /tests 2>&1 | head -1")
    assert "pytest 8.3.3" in out, out


def test_a_failing_step_names_itself_and_leaves_no_image(sub: RecipeImages, tmp_path: Path) -> None:
    task = a_task(tmp_path, "FROM debian:bookworm\nRUN echo starting\nRUN exit 3\n")
    recipe = agent_recipe(load_specs(str(task))[0])
    with pytest.raises(ImageBuildError) as e:
        sub.build_recipe(recipe)
    # the builders' own words for the exit: docker "returned a non-zero code: 3", podman "exit status 3"
    assert "failed at RUN exit 3:" in str(e.value), e.value
    assert re.search(r"non-zero code: 3|exit status 3", str(e.value)), e.value
    assert not engine(sub).exists(f"drumsbench-task:{recipe.digest()[:16]}")


def test_a_slow_build_stops_at_its_limit(sub: RecipeImages, tmp_path: Path) -> None:
    """A silent step past ``build_timeout_sec``: the limit, not the step's end, ends the wait; the
    image never appears under the task's tag, not even once the step would have finished."""
    task = a_task(tmp_path, "FROM debian:bookworm\nRUN sleep 12 && touch /slow\n", timeout=3)
    recipe = agent_recipe(load_specs(str(task))[0])
    t0 = time.monotonic()
    with pytest.raises(ImageBuildError, match="time limit"):
        sub.build_recipe(recipe)
    assert time.monotonic() - t0 < 10
    time.sleep(12)
    assert not engine(sub).exists(f"drumsbench-task:{recipe.digest()[:16]}")
    assert not [n for n in image_names(sub) if "drumsbench-task-build" in n]
    # and the step itself was stopped, not left running on the host
    assert subprocess.run(["pgrep", "-f", "sleep 12 && touch /slow"], capture_output=True).returncode == 1
