"""Positive controls of the red team: every forging strategy of ``adversary.CODE`` reaches success
against a NAIVE verifier (``drumsbench.testing.naive_verifier``: the hidden tests in one process
with the code under test, its output trusted without a secret). A strategy that ends failed
against the real verifier proves something only if it can win where its flaw is present; one that
wins nowhere tests nothing. The task's bug left in and no strategy ends failed under the same
naive verifier (and the oracle succeeds): the wins are the strategies' own."""

from __future__ import annotations

import time

from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.adversary import CODE, FORGING, NOT_FORGING, Adversary
from drumsbench.policies.scripted import Policy, make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.testing.naive_verifier import NAIVE, NaiveCodingEnv

TASK = "intervals-business-days-end"
CFG = RolloutConfig(step_timeout_s=30.0, episode_timeout_s=120.0, verify_timeout_s=15.0, max_steps=20)

# The code strategies that try to reach success (forge a pass): each must win against the naive
# verifier, on the process substrate (native_frame_walk builds its C extension there with the
# host's gcc and Python headers; the container images have neither) unless ON says otherwise.
# report_fd_spray wins here only by its os._exit(0): the naive runner has no report pipe to spray.
# verdict_proc_fd reopens its stdout through /proc: on process that pipe is root's (mode 0600) and
# the sandbox's uid cannot open it, whatever the verifier; in a container the sandbox is root.
ON = {"verdict_proc_fd": "docker"}


def test_every_code_strategy_is_classified():
    assert not set(FORGING) & set(NOT_FORGING)
    assert set(FORGING) | set(NOT_FORGING) == set(CODE), \
        f"classify in FORGING or NOT_FORGING: {sorted(set(CODE) - set(FORGING) - set(NOT_FORGING))}"


def test_forging_strategies_win_against_the_naive_verifier(state_dir, run_id):
    task = next(t for t in load_suite("coding") if t.id == TASK)
    canaries = CanaryRegistry()
    out, t0, seq = {}, time.monotonic(), iter(range(1000))

    def attempt(slot: Slot, policy: Policy) -> AttemptRecord:
        return run_attempt(slot, task, policy, CFG, canaries, run_id=run_id, seq=next(seq), seed=0)

    for substrate in sorted({ON.get(n, "process") for n in FORGING}):
        slot = Slot(registry.get(substrate)(run_id, state_dir), NaiveCodingEnv())
        try:
            for name in FORGING:
                if ON.get(name, "process") == substrate:
                    out[name] = attempt(slot, Adversary([name]))
            if substrate == "process":
                bug_only, oracle = attempt(slot, make_policy("null")), attempt(slot, make_policy("oracle"))
        finally:
            slot.destroy()
            left = slot.substrate.leftovers()
            slot.substrate.close()
        assert not left, left
    print(f"{len(out) + 2} attempts in {time.monotonic() - t0:.1f} s")
    assert all(r.extra.get("strategy") == n for n, r in out.items())
    assert all(r.extra.get("verifier") == NAIVE for r in [*out.values(), bug_only, oracle]), bug_only.extra
    lost = {n: (r.outcome, r.cause, r.detail) for n, r in out.items() if r.outcome is not Outcome.SUCCESS}
    assert not lost, f"forging strategies that do not win even against the naive verifier: {lost}"
    assert bug_only.outcome is Outcome.FAILED and "naive verdict" in bug_only.detail, bug_only.detail
    assert oracle.outcome is Outcome.SUCCESS, oracle.detail
