"""Harbor task folders are read with Harbor's own models (its interpreter, its pinned version) and
then checked more strictly: every refusal is one line naming the file and the fix.

The peer check makes a task with Harbor's own ``harbor tasks init`` at test time (Harbor's content
is never copied into this repository) and reads it here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.envs.harbor import interpreter
from drumsbench.envs.harbor.spec import load_specs

from conftest import require

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"


@pytest.fixture(scope="module", autouse=True)
def harbor_here() -> None:
    require(interpreter.missing())


def refusal(path: Path) -> str:
    """The one-line refusal of loading ``path``."""
    with pytest.raises(UsageError) as e:
        load_specs(str(path))
    text = str(e.value)
    assert "\n" not in text, text
    return text


def copy_example(tmp_path: Path, name: str = "count-words") -> Path:
    dest = tmp_path / "suite" / name
    shutil.copytree(EXAMPLES / name, dest, symlinks=True)
    return dest


def test_examples_load_with_their_limits() -> None:
    specs = {s.id: s for s in load_specs(str(EXAMPLES))}
    assert sorted(specs) == ["build-checksum", "count-words", "fix-median", "fix-roman", "fix-slug", "install-service",
                             "log-summary", "merge-json", "revert-commit", "set-timezone-config"]
    words = specs["count-words"]
    assert (words.base.ref, words.base.flavor, words.workdir) == ("debian:bookworm-slim", "debian", "/app")
    assert (words.agent_timeout_s, words.verifier_timeout_s, words.cpus, words.memory_mb) == (300.0, 60.0, 1, 512)
    assert words.network_asked == "no-network" and words.verifier_mode == "shared"
    assert "number of words" in words.instruction
    median = specs["fix-median"]
    assert median.base.flavor == "python" and median.base.python == "3.11"
    assert median.verifier_mode == "separate" and median.verifier_base is not None
    assert specs["set-timezone-config"].workdir == "/work"
    # one task folder alone is a suite of one
    assert [s.id for s in load_specs(str(EXAMPLES / "build-checksum"))] == ["build-checksum"]


def test_harbor_refusal_is_harbor_reason(tmp_path: Path) -> None:
    task = copy_example(tmp_path)
    (task / "tests" / "test.sh").unlink()
    line = refusal(task)
    assert "Harbor refuses this task" in line and "test" in line, line
    task = copy_example(tmp_path, "fix-median")
    (task / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    line = refusal(task)
    assert "Harbor refuses this task" in line and "verifier.timeout_sec" in line, line


def test_malformed_task_toml_names_the_file(tmp_path: Path) -> None:
    task = copy_example(tmp_path)
    (task / "task.toml").write_text("[verifier\ntimeout_sec = 1\n")
    line = refusal(task.parent)
    assert str(task / "task.toml") in line, line


def test_missing_solve_sh(tmp_path: Path) -> None:
    task = copy_example(tmp_path)
    (task / "solution" / "solve.sh").unlink()
    line = refusal(task)
    assert line.startswith(str(task / "solution" / "solve.sh")) and "oracle" in line, line
    # Harbor itself takes the folder: the stricter check is DrumsBench's
    assert interpreter.parse([task])[0]["ok"] is True


def test_links_out_of_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "answers"
    outside.mkdir()
    (outside / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    task = copy_example(tmp_path)
    shutil.rmtree(task / "tests")
    (task / "tests").symlink_to(outside)
    line = refusal(task)
    assert "outside" in line and "tests" in line, line
    task = copy_example(tmp_path, "build-checksum")
    (task / "tests" / "test.sh").unlink()
    (task / "tests" / "test.sh").symlink_to(outside / "test.sh")
    assert "outside" in refusal(task.parent)


@pytest.mark.parametrize(("dockerfile", "named"), [
    ("FROM ubuntu:24.04\n", "ubuntu:24.04"),
    ("FROM python:3.12-slim\n", "python:3.12-slim"),
    ("FROM debian:latest\n", "debian:latest"),
    ("FROM debian:bookworm\nCOPY --from=ghcr.io/astral-sh/uv:0.9.7 /uv /usr/local/bin/uv\n", "ghcr.io/astral-sh/uv"),
    ("ARG BASE\nFROM $BASE\n", "BASE"),
    ("FROM debian:bookworm@sha256:" + "0" * 64 + "\n", "sha256"),
])
def test_base_images_that_cannot_be_had(tmp_path: Path, dockerfile: str, named: str) -> None:
    task = copy_example(tmp_path)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    line = refusal(task)
    assert named in line and str(task / "environment" / "Dockerfile") in line, line
    assert ("use debian:bookworm" in line) != ("has no default" in line), line


def test_compose_and_steps_are_refused(tmp_path: Path) -> None:
    task = copy_example(tmp_path)
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    assert "docker-compose.yaml" in refusal(task)


def test_peer_harbor_tasks_init(tmp_path: Path) -> None:
    """Harbor's own template: read here as Harbor reads it; its base images (ubuntu:24.04 for the
    agent, python:3.12-slim plus an image from ghcr.io for the verifier) cannot be had on this
    machine, and the refusal names the first; with Debian's images in their place it loads."""
    harbor = Path(str(interpreter.harbor_python())).with_name("harbor")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    subprocess.run([str(harbor), "tasks", "init", "drums/peer", "-p", str(tmp_path)], env=env, check=True,
                   capture_output=True, timeout=120)
    task = tmp_path / "peer"
    assert "ubuntu:24.04" in refusal(task)
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    assert "tests/Dockerfile:1: FROM python:3.12-slim" in refusal(task)
    text = (task / "tests" / "Dockerfile").read_text()
    (task / "tests" / "Dockerfile").write_text(text.replace("python:3.12-slim", "python:3.11-slim"))
    assert "COPY --from ghcr.io/astral-sh/uv" in refusal(task)
    (task / "tests" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nCOPY . /tests/\n")
    (spec,) = load_specs(str(task))
    assert (spec.id, spec.name, spec.verifier_mode, spec.workdir) == ("peer", "drums/peer", "separate", "/app")
    assert spec.verifier_timeout_s == spec.agent_timeout_s == 600.0


def test_missing_interpreter_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMSBENCH_HARBOR_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(UsageError, match=r"setup-harbor\.sh"):
        load_specs(str(EXAMPLES))
