"""``DrumsBench/Coding-v0`` and ``DrumsBench/Desktop-v0``: Gymnasium's own checker passes; oracle
episodes earn 1, null 0; an invalid episode's reward is nan (or ``InvalidEpisode`` is raised), never
0; truncation at the step limit is a valid failure; every episode is in the ledger."""

from __future__ import annotations

import math
import sqlite3

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import drumsbench.gym as dgym
from drumsbench.envs.base import ActionSpec
from drumsbench.envs.coding.task import load_suite

from conftest import require


@pytest.fixture
def make(tmp_path, monkeypatch):
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    made = []

    def _make(id="DrumsBench/Coding-v0", **kw):
        env = gym.make(id, out=str(tmp_path / "runs"), **kw)
        made.append(env)
        return env

    yield _make
    for env in made:
        env.close()
    assert not list((tmp_path / "state" / "sandboxes").glob("*/*")), "a sandbox was left behind"


def ledger_rows(tmp_path):
    db = sqlite3.connect(tmp_path / "runs" / "ledger.sqlite")
    try:
        return db.execute("SELECT r.kind, a.outcome, a.cause, a.reward, a.detail FROM attempts a "
                          "JOIN runs r USING (run_id)").fetchall()
    finally:
        db.close()


def test_check_env_passes(make):
    env = make()
    check_env(env.unwrapped)
    assert isinstance(env.observation_space, gym.spaces.Dict) and isinstance(env.action_space, gym.spaces.Dict)


def play(env, task, plan):
    obs, info = env.reset(seed=0, options={"task": task.id})
    assert task.description.split()[0] in obs["text"] and info["valid"] is None
    for spec in plan:
        obs, reward, terminated, truncated, info = env.step({"kind": spec.kind, **spec.payload})
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            return reward, terminated, truncated, info
    raise AssertionError("the plan ended without the episode ending")


def test_oracle_earns_one_and_null_zero(make, tmp_path):
    env = make()
    tasks = load_suite("coding")[:3]
    for task in tasks:
        assert play(env, task, task.oracle_plan())[:3] == (1.0, True, False)
        reward, terminated, truncated, info = play(env, task, [ActionSpec("submit")])
        assert (reward, terminated, truncated) == (0.0, True, False)
        assert info["outcome"] == "failed" and info["valid"] is True and info["cause"] is None
    env.close()
    rows = ledger_rows(tmp_path)
    assert sorted(r[1] for r in rows) == ["failed"] * 3 + ["success"] * 3 and {r[0] for r in rows} == {"gym"}


def test_truncation_is_a_valid_failure(make):
    env = make(max_steps=2)
    env.reset(seed=1)
    for _ in range(2):
        assert env.step({"kind": 0, "text": "true"})[1:4] == (0.0, False, False)
    _obs, reward, terminated, truncated, info = env.step({"kind": "shell", "command": "true"})
    assert (reward, terminated, truncated, info["outcome"], info["valid"]) == (0.0, False, True, "failed", True)


@pytest.mark.filterwarnings("ignore:.*NaN")  # gymnasium's passive checker notes the nan: that is the point
@pytest.mark.parametrize("invalid", ["nan", "raise"])
def test_an_invalid_episode_is_never_reward_zero(make, tmp_path, invalid):
    env = make(invalid=invalid)
    env.reset(seed=2)
    env.unwrapped._backend.session.slot.sandbox.destroy()  # the sandbox gone behind the harness's back
    if invalid == "raise":
        with pytest.raises(dgym.InvalidEpisode) as caught:
            env.step({"kind": "shell", "command": "ls"})
        info = caught.value.info
    else:
        _obs, reward, terminated, truncated, info = env.step({"kind": "shell", "command": "ls"})
        assert math.isnan(reward) and terminated and not truncated
    assert info["valid"] is False and info["outcome"] == "invalid" and info["cause"] == "substrate_failure"
    env.close()
    rows = ledger_rows(tmp_path)
    assert [(r[1], r[2], r[3]) for r in rows] == [("invalid", "substrate_failure", None)]


def test_closing_mid_episode_records_the_attempt_as_invalid(make, tmp_path):
    env = make()
    env.reset(seed=3)
    env.step({"kind": "shell", "command": "ls"})
    env.close()
    rows = ledger_rows(tmp_path)
    assert [(r[1], r[2]) for r in rows] == [("invalid", "policy_unavailable")] and "closed" in rows[0][4]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_desktop_check_env_and_an_oracle_episode(make):
    from drumsbench.envs.desktop import instance
    from drumsbench.envs.desktop.task import load_suite as desktop_suite

    require(instance.missing())
    env = make(id="DrumsBench/Desktop-v0", render_mode="rgb_array")
    check_env(env.unwrapped)  # declared nondeterministic: a live GUI does not repeat pixel for pixel
    tasks = {t.id: t for t in desktop_suite("desktop")}
    obs, info = env.reset(seed=0)
    assert obs["screen"].shape == (800, 1280, 3) and obs["screen"].any() and "LibreOffice" in obs["title"]
    for spec in tasks[info["task"]].oracle_plan():
        obs, reward, terminated, truncated, info = env.step({"kind": spec.kind, **spec.payload})
    assert (reward, terminated, truncated, info["outcome"], info["valid"]) == (1.0, True, False, "success", True)
    assert env.render().shape == (800, 1280, 3)
