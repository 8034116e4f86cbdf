"""The environment checker passes on the built-in kinds and fails an environment that breaks a rule."""

from __future__ import annotations

from drumsbench.envs.base import Action, Observation
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.experiments.envcheck import CHECKS, check_environment
from drumsbench.substrates.process import ProcessSubstrate

from helpers import MINI


class AppliesStaleActions(CodingEnv):
    """Forgets gate 2: applies an action whatever its generation."""

    def step(self, action: Action, timeout: float) -> Observation:
        self.step_count += 1
        return self._apply(action, timeout)


class SeesNoBadObservation(CodingEnv):
    """Calls every observation good, a cut one included."""

    def observation_problem(self, obs: Observation) -> str | None:
        return None


def _run(make_env, state_dir, run_id) -> dict[str, tuple[bool, str]]:
    sub = ProcessSubstrate(run_id, state_dir)
    try:
        results = check_environment(make_env, load_suite(MINI)[0], sub)
    finally:
        sub.close()
    assert [c.check for c in results] == list(CHECKS)
    return {c.check: (c.ok, c.detail) for c in results}


def test_the_coding_environment_passes(state_dir, run_id):
    got = _run(CodingEnv, state_dir, run_id)
    assert all(ok for ok, _ in got.values()), got
    assert got["bad_observation"][1] == "invalid/bad_observation"


def test_an_environment_that_applies_stale_actions_fails(state_dir, run_id):
    got = _run(AppliesStaleActions, state_dir, run_id)
    assert not got["stale_action"][0] and "was applied" in got["stale_action"][1], got["stale_action"]
    assert got["oracle"][0] and got["null"][0]  # the rest still holds: one check names one broken rule


def test_an_environment_blind_to_broken_observations_fails(state_dir, run_id):
    got = _run(SeesNoBadObservation, state_dir, run_id)
    assert not got["bad_observation"][0], got["bad_observation"]
    assert got["stale_action"][0] and got["verifier_unavailable"][0]
