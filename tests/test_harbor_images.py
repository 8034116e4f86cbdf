"""A Harbor task's own Dockerfile is built on this machine (``RecipeImages`` of the docker and podman
substrates): its outside bases become this machine's Debian images, ``RUN`` reaches the registries,
the result is cached by content, and a failed or slow build leaves nothing under the task's tag."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drumsbench.core.errors import ImageBuildError, SubstrateError
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.recipe import agent_recipe, verifier_recipe
from drumsbench.envs.harbor.spec import load_specs
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages, Sandbox
from drumsbench.substrates.containers.common import REAPER_ARGV, task_sandbox_tag
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


def image_config(sub: RecipeImages, ref: str) -> dict[str, Any]:
    """The engine's ``Config`` of image ``ref`` (``Id`` added)."""
    if sub.name == "podman":
        found = json.loads(podman(["image", "inspect", ref]).stdout)[0]
    else:
        found = sub.client.api.inspect_image(ref)
    return {**found["Config"], "Id": found["Id"]}


def container_image(sub: RecipeImages, box: Sandbox) -> str:
    """The image id the sandbox's container runs."""
    cid = box.container_id  # type: ignore[attr-defined]
    if sub.name == "podman":
        return str(json.loads(podman(["inspect", cid]).stdout)[0]["Image"]).removeprefix("sha256:")
    return str(sub.client.api.inspect_container(cid)["Image"]).removeprefix("sha256:")


def test_sandboxes_of_a_task_image(sub: RecipeImages) -> None:
    """``create_from_image``: a sandbox of the task's own image (its files and WORKDIR) with the
    sandbox's folders on top, no network; the sandbox image is made once, each sandbox is fresh."""
    spec = {s.id: s for s in load_specs(str(EXAMPLES))}["count-words"]
    assert spec.workdir == "/app"
    image = sub.build_recipe(agent_recipe(spec))
    boxes: list[Sandbox] = []
    try:
        t0 = time.monotonic()
        boxes.append(sub.create_from_image(image))
        first_s = time.monotonic() - t0
        box = boxes[0]
        run = lambda cmd, **kw: box.exec(cmd, timeout=30, **kw)  # noqa: E731
        assert run(["pwd"], cwd=spec.workdir).stdout == b"/app\n"
        assert run(["ls", "-A"], cwd=spec.workdir).stdout.split() == [b"notes.txt"]
        assert run("stat -c '%a' /sandbox/tmp; ls -A /sandbox/tmp | wc -l").stdout.split() == [b"1777", b"0"]
        p = box.paths
        assert run(["test", "-d", p.work, "-a", "-d", p.home, "-a", "-d", p.tmp]).exit_code == 0
        devices = [ln.split(b":")[0].strip() for ln in run(["cat", "/proc/net/dev"]).stdout.splitlines()[2:]]
        assert devices == [b"lo"], devices
        net = run(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"])
        assert net.exit_code != 0 and b"unreachable" in net.stderr, net
        assert b"python3" in run(["cat", "/proc/1/cmdline"]).stdout  # the reaper is pid 1
        assert run(["sh", "-c", "echo mine > left.txt"], cwd=spec.workdir).exit_code == 0

        sandbox_image = image_config(sub, task_sandbox_tag(image))
        assert container_image(sub, box) == sandbox_image["Id"].removeprefix("sha256:")
        base = image_config(sub, image)
        assert sandbox_image["WorkingDir"] == base["WorkingDir"] == "/app"
        # (podman's commit adds the two variables it gives every container: TERM and container)
        assert set(base["Env"]) <= set(sandbox_image["Env"]) <= {*base["Env"], "TERM=xterm", "container=podman"}
        assert sandbox_image["Cmd"] == REAPER_ARGV and not sandbox_image.get("Entrypoint")
        assert sandbox_image["Labels"]["drumsbench.image"] == "task"
        assert sandbox_image["Labels"]["drumsbench.base"] == image

        t0 = time.monotonic()
        boxes.append(sub.create_from_image(image))
        again_s = time.monotonic() - t0
        second = boxes[1]
        assert container_image(sub, second) == container_image(sub, box)
        assert image_config(sub, task_sandbox_tag(image))["Id"] == sandbox_image["Id"]  # not rebuilt
        assert again_s < max(5.0, first_s), (first_s, again_s)
        assert second.exec(["ls", "-A"], cwd=spec.workdir, timeout=30).stdout.split() == [b"notes.txt"]
        assert run(["cat", "left.txt"], cwd=spec.workdir).stdout == b"mine\n"
    finally:
        for b in boxes:
            b.destroy()


def test_a_task_image_keeps_its_config(sub: RecipeImages, tmp_path: Path) -> None:
    """The task image's ENV, WORKDIR and files stay in its sandbox image; its ENTRYPOINT does not
    (the reaper is pid 1); a reference that is no image is a ``SubstrateError``."""
    task = a_task(tmp_path, 'FROM debian:bookworm-slim\nENV GREETING=hello\nWORKDIR /srv/x\n'
                            'RUN echo kept > /srv/x/f\nENTRYPOINT ["/bin/false"]\n')
    image = sub.build_recipe(agent_recipe(load_specs(str(task))[0]))
    box = sub.create_from_image(image)
    try:
        out = box.exec(["sh", "-c", "pwd; cat f; echo $GREETING; tr '\\0' ' ' < /proc/1/cmdline | cut -c1-20"],
                       cwd="/srv/x", timeout=30)
        assert out.stdout.decode().split("\n")[:4] == ["/srv/x", "kept", "hello", "python3 -S -E -c imp"], out
    finally:
        box.destroy()
    config = image_config(sub, task_sandbox_tag(image))
    assert config["WorkingDir"] == "/srv/x" and "GREETING=hello" in config["Env"]
    with pytest.raises(SubstrateError, match="no image"):
        sub.create_from_image("drumsbench-task:0000000000000000")
