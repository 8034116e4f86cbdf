"""The three outcomes: an infrastructure fault can never carry reward 0."""

import pytest
from pydantic import ValidationError

from drumsbench.core.outcome import InvalidCause, Outcome, Verdict


def test_constructors_are_consistent():
    assert Verdict.success().reward == 1.0
    assert Verdict.failed().reward == 0.0
    v = Verdict.invalid(InvalidCause.STEP_TIMEOUT, "x")
    assert v.reward is None and v.cause is InvalidCause.STEP_TIMEOUT and not v.valid


@pytest.mark.parametrize("outcome,reward,cause", [
    (Outcome.INVALID, 0.0, InvalidCause.DIRTY_RESET),   # invalid scored 0: the defect this tool exists to stop
    (Outcome.INVALID, None, None),                      # invalid without a cause
    (Outcome.FAILED, 0.0, InvalidCause.STEP_TIMEOUT),   # a failure that names an infra cause
    (Outcome.SUCCESS, 0.0, None),
    (Outcome.FAILED, None, None),
])
def test_inconsistent_verdicts_cannot_be_built(outcome, reward, cause):
    with pytest.raises(ValidationError):
        Verdict(outcome=outcome, reward=reward, cause=cause)


def test_nine_causes():
    assert {c.value for c in InvalidCause} == {
        "dirty_reset", "stale_generation", "step_timeout", "episode_timeout", "bad_observation",
        "verifier_unavailable", "contamination", "substrate_failure", "policy_unavailable"}


def test_a_verifier_result_is_passed_or_failed_with_its_reason():
    from drumsbench.envs.base import VerifierResult

    assert VerifierResult.success(tests=3, passed=3).evidence == {"tests": 3, "passed": 3}
    failed = VerifierResult.failed("verifier: 1 of 3 expected tests passed", tests=3, passed=1)
    assert (failed.passed, failed.reason) == (False, "verifier: 1 of 3 expected tests passed")
    with pytest.raises(ValueError, match="needs its reason"):
        VerifierResult.failed("  ")
    with pytest.raises(ValueError, match="no reason"):
        VerifierResult(True, "but why")
