"""Task images on the namespace substrates (``overlay`` and ``bwrap``): built by a container engine,
run from the engine's own layer folders (``containers/layered_images.py``). What a sandbox of such an
image sees is the image as the engine would show it (whiteouts and opaque folders included, the
image's ``ENV``), its writes are its own, and nothing of the host is in its view."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.recipe import agent_recipe
from drumsbench.envs.harbor.spec import load_specs
from drumsbench.substrates import registry
from drumsbench.substrates.base import RecipeImages, Substrate
from drumsbench.substrates.hostproc import mounts_below

from conftest import require

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"
# Layers that only show right when overlayfs reads the engine's whiteouts and opaque folders: /gone
# is deleted by a later layer, /d is replaced by a new folder holding only b.
DOCKERFILE = """FROM debian:bookworm-slim
ENV GREETING=hello
RUN mkdir -p /srv/x /d && echo kept > /srv/x/f && echo old > /gone && touch /d/a
RUN rm /gone && rm -rf /d && mkdir /d && touch /d/b
WORKDIR /srv/x
"""


@pytest.fixture(scope="module", params=["overlay", "bwrap"])
def sub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Substrate]:
    require(interpreter.missing())
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls(f"layered-{request.param}", tmp_path_factory.mktemp("state"))
    assert isinstance(s, RecipeImages)
    yield s
    s.close()
    assert s.leftovers() == []


def image_of(sub: Substrate, tmp_path: Path, dockerfile: str) -> str:
    task = tmp_path / "suite" / "t"
    shutil.copytree(EXAMPLES / "count-words", task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    assert isinstance(sub, RecipeImages)
    return sub.build_recipe(agent_recipe(load_specs(str(task))[0]))


def test_a_sandbox_sees_the_image_as_its_engine_does(sub: Substrate, tmp_path: Path) -> None:
    assert isinstance(sub, RecipeImages)
    image = image_of(sub, tmp_path, DOCKERFILE)
    box, other = sub.create_from_image(image), sub.create_from_image(image)
    try:
        run = lambda cmd, b=box: b.exec(["sh", "-c", cmd], cwd="/srv/x", timeout=30)  # noqa: E731
        out = run("pwd; cat f; echo $GREETING; ls /d; test -e /gone && echo GONE-IS-BACK; ls -A /sandbox")
        assert out.stdout.decode().split() == ["/srv/x", "kept", "hello", "b", "home", "tmp", "verify", "work"], out
        devices = [ln.split(b":")[0].strip() for ln in run("cat /proc/net/dev").stdout.splitlines()[2:]]
        assert devices == [b"lo"]
        # nothing of the host: not its checkout, not the engines' stores, not the state folder
        for host in (str(Path(__file__).parent), "/var/lib/docker", str(sub.state_dir)):
            assert run(f"test -e {host} && echo seen").stdout == b"", host
        assert box.read_file("/srv/x/f") == b"kept\n"

        assert run("echo mine > f && rm /etc/hostname && echo t > /tmp/t").exit_code == 0
        assert run("cat f; cat /tmp/t").stdout == b"mine\nt\n"  # kept between commands
        assert run("cat f", other).stdout == b"kept\n"  # never another sandbox's
        assert box.tree_digest("/srv/x") != other.tree_digest("/srv/x")
        box.reset_in_place()
        assert run("cat f; test -e /etc/hostname && test ! -e /tmp/t && echo back").stdout == b"kept\nback\n"
        assert box.tree_digest("/srv/x") == other.tree_digest("/srv/x")
    finally:
        box.destroy()
        other.destroy()
    assert [m for m in mounts_below(sub.state_dir) if "layered" in m] == []


def test_an_image_that_is_not_root_is_refused_in_one_line(sub: Substrate, tmp_path: Path) -> None:
    with pytest.raises(SubstrateError, match=f"^{sub.name}: image .* runs as USER nobody; .*use docker or podman"):
        image_of(sub, tmp_path, "FROM debian:bookworm-slim\nWORKDIR /srv\nUSER nobody\n")
    assert isinstance(sub, RecipeImages)
    with pytest.raises(SubstrateError, match="no image"):
        sub.create_from_image("docker:0000")
