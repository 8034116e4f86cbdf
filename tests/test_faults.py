"""Fault plans: parsing errors name the problem; draws are deterministic and follow the rates."""

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import InvalidCause
from drumsbench.rollout.faults import FaultPlan


@pytest.mark.parametrize("text,needle", [
    ("stale_generation", "has no '='"),
    ("nonsense=0.1", "unknown cause 'nonsense'"),
    ("step_timeout=abc", "not a number"),
    ("step_timeout=1.5", "outside 0..1"),
    ("step_timeout=0.6,dirty_reset=0.6", "add up to"),
])
def test_bad_inject_strings(text, needle):
    with pytest.raises(UsageError, match=needle):
        FaultPlan.parse(text)


def test_draws_are_deterministic_and_follow_rates():
    plan = FaultPlan.parse("stale_generation=0.1,contamination=0.2", seed=7)
    draws = [plan.draw(i) for i in range(5000)]
    assert draws == [FaultPlan.parse("stale_generation=0.1,contamination=0.2", seed=7).draw(i) for i in range(5000)]
    assert 0.08 < draws.count(InvalidCause.STALE_GENERATION) / 5000 < 0.12
    assert 0.17 < draws.count(InvalidCause.CONTAMINATION) / 5000 < 0.23
    assert FaultPlan.parse("").draw(3) is None
