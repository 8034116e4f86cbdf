"""The environment checker (in the manner of Gymnasium's ``check_env``): what every environment kind
must do for its rewards to be trusted, proved on a real substrate with one task of its suite.

Checks, each a real episode or step (no mock):

1. ``reset``: a reset bumps the generation by one and the start state digests to the task's
   fingerprint (gate 1), twice in a row;
2. ``stale_action``: an action of an earlier generation is refused (``StaleGeneration``) before the
   sandbox is touched: the first action of the oracle's plan, sent stale, changes nothing;
3. ``capture``: ``capture()`` then ``compare()`` of the same state agree on every dimension (for a
   kind that can be branched; others say so);
4. ``oracle`` / ``null``: the oracle's plan succeeds, the null policy (submit at once) fails;
5. ``bad_observation`` / ``verifier_unavailable``: the real fault injected from outside is classified
   with its own cause, never as success or failed.

``check_environment`` returns one ``EnvCheck`` per check (ok, or what went wrong); ``drumsbench tasks
check`` runs it for any kind before the kind's own task checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from drumsbench.core.errors import InvalidAttempt, StaleGeneration, SubstrateError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.base import SUBMIT, Action, Environment, Task
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout import gates
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import Substrate

CHECKS = ("reset", "stale_action", "capture", "oracle", "null", "bad_observation", "verifier_unavailable")


@dataclass(frozen=True)
class EnvCheck:
    check: str
    ok: bool
    detail: str


def check_environment(make_env: Callable[[], Environment], task: Task, substrate: Substrate,
                      cfg: RolloutConfig | None = None) -> list[EnvCheck]:
    """Run every check of ``CHECKS`` for ``task`` on ``substrate``; each in its own sandbox."""
    cfg = cfg or RolloutConfig(step_timeout_s=60, episode_timeout_s=600)
    out: list[EnvCheck] = []
    seq = itertools.count()

    def one(name: str, fn: Callable[[Slot], str]) -> None:
        slot = Slot(substrate, make_env())
        try:
            slot.provision(task)
            out.append(EnvCheck(name, True, fn(slot)))
        except (AssertionError, InvalidAttempt, SubstrateError, NotImplementedError) as e:
            out.append(EnvCheck(name, False, f"{type(e).__name__}: {e}"[:400]))
        finally:
            slot.destroy()

    def reset(slot: Slot) -> str:
        env = slot.env
        for _ in range(2):
            before = env.generation
            env.reset(task)
            assert env.generation == before + 1, f"reset took the generation from {before} to {env.generation}"
            gates.check_reset(env, task)
        return f"generation {env.generation}, start state matches {task.start_fingerprint[:19]}..."

    def stale(slot: Slot) -> str:
        env = slot.env
        env.reset(task)
        first = next((a for a in task.oracle_plan() if a.kind != SUBMIT), None)
        assert first is not None, "the oracle's plan has no action before submit"
        env.reset(task)  # the second reset makes generation - 1 an earlier, once valid generation
        digest = env.fingerprint()
        try:
            env.step(Action.of(first, env.generation - 1), cfg.step_timeout_s)
        except StaleGeneration:
            pass
        else:
            raise AssertionError("an action of the previous generation was applied")
        assert env.fingerprint() == digest, "the refused action changed the sandbox"
        return f"{first.kind} of generation {env.generation - 1} refused; the sandbox unchanged"

    def capture(slot: Slot) -> str:
        env = slot.env
        env.reset(task)
        try:
            state = env.capture()
        except NotImplementedError:
            return f"{env.kind} cannot be branched: nothing to check"
        dims = env.compare(state, env.capture())
        wrong = sorted(d for d, same in dims.items() if not same)
        assert not wrong, f"capture/compare of one unchanged state disagree on: {', '.join(wrong)}"
        return f"round trip agrees on {len(dims)} dimension(s): {', '.join(sorted(dims))}"

    def episode(policy: str, fault: InvalidCause | None, want: Outcome,
                cause: InvalidCause | None = None) -> Callable[[Slot], str]:
        def run(slot: Slot) -> str:
            rec = run_attempt(slot, task, make_policy(policy), cfg, CanaryRegistry(), run_id=substrate.run_id,
                              seq=next(seq), seed=0, fault=fault)
            got = f"{rec.outcome.value}" + (f"/{rec.cause.value}" if rec.cause else "")
            assert rec.outcome is want and rec.cause == cause, \
                f"{policy}{f' with {fault.value} injected' if fault else ''}: {got} ({rec.detail}); want " \
                f"{want.value}{f'/{cause.value}' if cause else ''}"
            return got
        return run

    one("reset", reset)
    one("stale_action", stale)
    one("capture", capture)
    one("oracle", episode("oracle", None, Outcome.SUCCESS))
    one("null", episode("null", None, Outcome.FAILED))
    one("bad_observation", episode("oracle", InvalidCause.BAD_OBSERVATION, Outcome.INVALID,
                                   InvalidCause.BAD_OBSERVATION))
    one("verifier_unavailable", episode("oracle", InvalidCause.VERIFIER_UNAVAILABLE, Outcome.INVALID,
                                        InvalidCause.VERIFIER_UNAVAILABLE))
    return out
