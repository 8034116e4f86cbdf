"""Adding an environment kind is one package (issue 31): ``knob`` (``tests/data/kinds/knob``), a
tiny kind registered only by its own entry point, is checked by the environment checker, runs with
``drumsbench run``, passes gymnasium's ``check_env`` through the generic ``DrumsBench/Env-v0``, is
served over OpenEnv (``openenv validate`` passes) and is driven by the endpoint policy — and
nothing of it is named outside its package."""

from __future__ import annotations

import importlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from loopback_openai import LoopbackOpenAI
from openenv.core.generic_client import GenericEnvClient
from test_serve import OPENENV, Server

import drumsbench.gym  # noqa: F401 - registers DrumsBench/Env-v0
from drumsbench.envs import suites

from helpers import cli

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tests" / "data" / "kinds" / "knob"
SUITE = str(PACKAGE / "suite")


@pytest.fixture(scope="module", autouse=True)
def knob_installed() -> Iterator[None]:
    """The kind's package and its dist-info on the path of this process and of every command it runs,
    as ``pip install`` would put them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PACKAGE))
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(PACKAGE), os.environ.get("PYTHONPATH")) if p))
        importlib.invalidate_caches()
        yield
    suites.KINDS._loaded.pop("knob", None)


def outcomes(out: Path) -> list[tuple[str, str | None, str]]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return db.execute("SELECT outcome, cause, task FROM attempts ORDER BY run_id, seq").fetchall()
    finally:
        db.close()


def test_the_kind_is_found_by_its_entry_point_and_named_nowhere_else() -> None:
    assert suites.KINDS.get_spec("knob") == "knob_kind:KIND"
    suite = suites.load(SUITE)
    assert suite.kind == "knob" and [t.id for t in suite.tasks] == ["to-minus-three", "to-seven"]
    assert suite.actions.names == ("turn", "submit") and suite.observations.__name__ == "KnobObservation"
    named = [str(p) for p in (ROOT / "src").rglob("*.py") if "knob_kind" in p.read_text() or "Knob" in p.read_text()]
    assert not named, f"the example kind is named outside its package: {named}"


def test_the_environment_checker_passes_it_and_the_adversary_refuses_it(tmp_path: Path) -> None:
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    check = cli("tasks", "check", SUITE, "--substrate", "process", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    # reset, stale action, capture, oracle 1, null 0, bad_observation and verifier_unavailable injected
    assert "7 of 7 checks passed (knob environment, process)" in check.stdout, check.stdout
    # a policy that cannot act in the kind is a usage error before any run is recorded
    bad = cli("run", "--tasks", SUITE, "--policy", "adversary", "--out", str(tmp_path / "runs"), env=env)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --policy adversary: no strategies for the knob environment yet"], bad.stderr
    assert not (tmp_path / "runs" / "ledger.sqlite").exists() or not outcomes(tmp_path / "runs")


def test_run_records_every_attempt_valid(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = cli("run", "--tasks", SUITE, "--policy", "noisy", "--attempts", "8", "--concurrency", "2",
               "--out", str(out), "--no-progress", env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    rows = outcomes(out)
    assert len(rows) == 8 and {r[0] for r in rows} == {"success", "failed"}, rows
    assert all(r[1] is None for r in rows)


def test_gymnasium_checks_it_and_an_oracle_episode_earns_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    env = gym.make("DrumsBench/Env-v0", tasks=SUITE, out=str(tmp_path / "runs"))
    try:
        check_env(env.unwrapped)
        assert env.action_space == gym.spaces.Dict({"kind": gym.spaces.Discrete(2),
                                                    "clicks": gym.spaces.Discrete(21, start=-10)})
        obs, info = env.reset(seed=0, options={"task": "to-seven"})
        assert "The knob stands at 2." in obs["text"] and "You look at the knob." in obs["text"]
        obs, reward, terminated, _, info = env.step({"kind": 0, "clicks": 5})
        assert "The knob stands at 7." in obs["text"] and reward == 0.0 and not terminated
        obs, reward, terminated, _, info = env.step({"kind": 1})
        assert (reward, terminated, info["valid"], info["outcome"]) == (1.0, True, True, "success")
        env.reset(seed=0, options={"task": "to-seven"})
        _, reward, terminated, _, info = env.step({"kind": "submit"})
        assert (reward, info["outcome"]) == (0.0, "failed") and "not at the mark 7" in info["detail"]
    finally:
        env.close()
    assert not list((tmp_path / "state" / "sandboxes").glob("*/*")), "a sandbox was left behind"


def test_served_over_openenv_it_validates_and_plays(tmp_path: Path) -> None:
    server = Server(tmp_path / "serve", "--tasks", SUITE, "--max-sessions", "2", "--idle", "20s")
    try:
        proc = subprocess.run([OPENENV, "validate", "--url", server.url], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with GenericEnvClient(base_url=server.url).sync() as client:
            r = client.reset(task="to-minus-three")
            assert r.observation["text"] == "The knob stands at 12." and r.observation["env"] == "knob"
            for clicks in (-10, -5):
                r = client.step({"kind": "turn", "clicks": clicks, "generation": r.observation["generation"]})
            r = client.step({"kind": "turn", "clicks": 11, "generation": r.observation["generation"]})
            assert "clicks" in r.observation["error"] and not r.done  # the model's bound: the policy's own step
            r = client.step({"kind": "submit", "generation": r.observation["generation"]})
            assert r.done and r.reward == 1.0 and r.observation["valid"] is True
    finally:
        server.stop()
    assert "Traceback" not in server.errors(), server.errors()
    server.assert_nothing_left()


def test_the_endpoint_policy_drives_it(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with LoopbackOpenAI(SUITE) as endpoint:
        proc = cli("run", "--tasks", SUITE, "--policy", "endpoint", "--endpoint", endpoint.url, "--model", "oracle",
                   "--attempts", "2", "--concurrency", "1", "--out", str(out), "--no-progress",
                   env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    rows = outcomes(out)
    assert [r[0] for r in rows] == ["success", "success"], rows
    assert endpoint.requests["oracle"] == sum(len(t.oracle_plan()) for t in suites.load(SUITE).tasks)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
