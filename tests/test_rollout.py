"""Controls and gates on every substrate: oracle succeeds, null fails, each injected fault is caught
with its own cause, and nothing else is ever invalid."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry, positive_control
from drumsbench.substrates import registry
from drumsbench.substrates.base import ResetStrategy

from conftest import require
from helpers import MINI, slot_on, slots_on

FAST = RolloutConfig(step_timeout_s=1.0, episode_timeout_s=2.5)


def fast_for(substrate: str) -> RolloutConfig:
    """Short timeouts that still leave room for a substrate's exec overhead on a loaded 2-core host."""
    return FAST if substrate == "process" else RolloutConfig(step_timeout_s=4.0, episode_timeout_s=9.0)


@pytest.fixture(params=registry.names())
def substrate_name(request):
    require(registry.get(request.param).missing())
    return request.param


@pytest.mark.parametrize("policy,expected", [("oracle", Outcome.SUCCESS), ("null", Outcome.FAILED)])
def test_controls_on_every_builtin_task(substrate_name, policy, expected, state_dir, run_id):
    """Every builtin task once, on two workers of one substrate as the harness runs them (one on
    the vm: two TCG guests on two cores only slow each other)."""
    slots = slots_on(substrate_name, run_id, state_dir, 1 if substrate_name == "vm" else 2)
    canaries = CanaryRegistry()
    cfg = RolloutConfig(step_timeout_s=30, episode_timeout_s=120)
    tasks = list(enumerate(load_suite("coding")))

    def play(k: int) -> dict[str, tuple[Outcome, str]]:
        slot, done = slots[k], {}
        for i, task in tasks[k::len(slots)]:
            rec = run_attempt(slot, task, make_policy(policy), cfg, canaries, run_id=run_id, seq=i, seed=0)
            done[task.id] = (rec.outcome, rec.detail)
        return done

    try:
        with ThreadPoolExecutor(len(slots)) as pool:
            outcomes = {t: o for part in pool.map(play, range(len(slots))) for t, o in part.items()}
    finally:
        for slot in slots:
            slot.destroy()
    assert len(outcomes) == len(tasks)
    wrong = {t: o for t, o in outcomes.items() if o[0] is not expected}
    assert not wrong, f"{policy} on {substrate_name}: {wrong}"
    assert not slots[0].substrate.leftovers()


def test_noisy_gives_both_valid_outcomes(state_dir, run_id):
    slot = slot_on("process", run_id, state_dir)
    task = load_suite("coding")[0]
    seen = set()
    try:
        for seq in range(12):
            rec = run_attempt(slot, task, make_policy("noisy", noisy_p=0.5), FAST, CanaryRegistry(),
                              run_id=run_id, seq=seq, seed=1)
            seen.add(rec.outcome)
    finally:
        slot.destroy()
    assert seen == {Outcome.SUCCESS, Outcome.FAILED}


def test_a_submit_of_another_generation_is_stale_like_any_action(state_dir, run_id):
    """Gate 2 holds for the submit too: a submit computed from an earlier observation (a trainer's
    stale queue) is refused, never verified; the same submit of the current generation is verified."""
    from drumsbench.envs.base import Action, Observation
    from drumsbench.policies.scripted import Policy

    class SubmitOf(Policy):
        name = "submit-of"

        def __init__(self, shift: int) -> None:
            super().__init__()
            self.shift = shift

        def plan(self, task, rng):
            return []

        def act(self, obs: Observation) -> Action:
            return Action("submit", obs.generation + self.shift)

    slot = slot_on("process", run_id, state_dir)
    task = load_suite(MINI)[0]
    try:
        recs = [run_attempt(slot, task, SubmitOf(shift), FAST, CanaryRegistry(), run_id=run_id, seq=i, seed=0)
                for i, shift in enumerate((-1, 0, -10**6))]
    finally:
        slot.destroy()
    assert [(r.outcome, r.cause) for r in recs] == [(Outcome.INVALID, InvalidCause.STALE_GENERATION),
                                                    (Outcome.FAILED, None),
                                                    (Outcome.INVALID, InvalidCause.STALE_GENERATION)], \
        [r.detail for r in recs]


@pytest.mark.parametrize("cause", list(InvalidCause), ids=lambda c: c.value)
def test_each_fault_is_caught_with_its_cause(substrate_name, cause, state_dir, run_id):
    slot = slot_on(substrate_name, run_id, state_dir)
    task = load_suite(MINI)[0]
    canaries = CanaryRegistry()
    cfg = fast_for(substrate_name)
    try:
        before = run_attempt(slot, task, make_policy("oracle"), cfg, canaries, run_id=run_id, seq=0, seed=0)
        rec = run_attempt(slot, task, make_policy("oracle"), cfg, canaries, run_id=run_id, seq=1, seed=0,
                          fault=cause)
        after = run_attempt(slot, task, make_policy("oracle"), cfg, canaries, run_id=run_id, seq=2, seed=0)
    finally:
        slot.destroy()
    assert before.outcome is Outcome.SUCCESS, before.detail
    assert rec.outcome is Outcome.INVALID and rec.reward is None
    assert rec.cause is cause, f"injected {cause}, got {rec.cause}: {rec.detail}"
    assert rec.injected is cause
    # the slot recovers: the next attempt is clean (a destroyed sandbox was replaced, not reused)
    assert after.outcome is Outcome.SUCCESS, after.detail


def test_timeouts_destroy_the_sandbox(state_dir, run_id):
    slot = slot_on("process", run_id, state_dir)
    task = load_suite(MINI)[0]
    try:
        run_attempt(slot, task, make_policy("oracle"), FAST, CanaryRegistry(), run_id=run_id, seq=0, seed=0)
        first = slot.sandbox
        rec = run_attempt(slot, task, make_policy("oracle"), FAST, CanaryRegistry(), run_id=run_id, seq=1, seed=0,
                          fault=InvalidCause.STEP_TIMEOUT)
        assert rec.cause is InvalidCause.STEP_TIMEOUT
        assert slot.sandbox is None and first is not None
        with pytest.raises(Exception, match="destroyed"):
            first.exec("true", timeout=1)
    finally:
        slot.destroy()


# the timeouts: test_timeouts_destroy_the_sandbox
@pytest.mark.parametrize("cause", [c for c in InvalidCause if c not in (InvalidCause.STEP_TIMEOUT,
                                                                      InvalidCause.EPISODE_TIMEOUT)],
                         ids=lambda c: c.value)
def test_a_sandbox_that_ended_an_attempt_invalid_is_never_handed_on(cause, state_dir, run_id):
    """Whatever the cause, the sandbox of an invalid attempt is destroyed and the next attempt gets
    a new one (a dead container once went on to the next attempt after a bad_observation, whose
    correct fix then ended invalid/substrate_failure with 0 steps)."""
    slot = slot_on("process", run_id, state_dir)
    task = load_suite(MINI)[0]
    canaries = CanaryRegistry()
    try:
        run_attempt(slot, task, make_policy("oracle"), FAST, canaries, run_id=run_id, seq=0, seed=0)
        first = slot.sandbox
        rec = run_attempt(slot, task, make_policy("oracle"), FAST, canaries, run_id=run_id, seq=1, seed=0, fault=cause)
        assert rec.cause is cause, rec.detail
        assert slot.sandbox is None and first is not None
        with pytest.raises(Exception, match="destroyed"):
            first.exec("true", timeout=1)
        after = run_attempt(slot, task, make_policy("oracle"), FAST, canaries, run_id=run_id, seq=2, seed=0)
        assert after.outcome is Outcome.SUCCESS, after.detail
        assert slot.sandbox is not None and slot.sandbox.id != first.id
    finally:
        slot.destroy()


@pytest.mark.parametrize("strategy", list(ResetStrategy))
def test_reset_strategies_both_verify(strategy, state_dir, run_id):
    slot = slot_on("process", run_id, state_dir)
    cfg = RolloutConfig(step_timeout_s=5, episode_timeout_s=20, reset=strategy)
    task = load_suite(MINI)[0]
    try:
        recs = [run_attempt(slot, task, make_policy("oracle"), cfg, CanaryRegistry(), run_id=run_id, seq=i, seed=0)
                for i in range(3)]
    finally:
        slot.destroy()
    assert [r.outcome for r in recs] == [Outcome.SUCCESS] * 3
    assert recs[0].provision_s > 0 and recs[1].provision_s == 0


def test_positive_control_fires_and_a_blind_detector_does_not(substrate_name, state_dir, run_id):
    cls = registry.get(substrate_name)
    assert positive_control(cls(run_id, state_dir)).fired

    class Blind(cls):  # a substrate whose canary scan sees nothing: the control must say so
        def create(self):
            box = super().create()
            box.scan = lambda folders, tokens: set()
            return box

    assert not positive_control(Blind(run_id, state_dir)).fired
