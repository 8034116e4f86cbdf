"""``drumsbench tasks check harbor:DIR``: Harbor's own oracle/nop check, on each substrate, through a run's path.

Contract of ``check_harbor(suite, substrates, state_dir, progress, repeat)``: for every task and
substrate, ``repeat`` attempts of Harbor's oracle (``solution/solve.sh``) must each end valid
success and ``repeat`` of its nop (submit at once) valid failed, each a whole attempt through
``run_attempt`` (its own fresh sandbox of the task's image, every gate, the stricter verifier);
anything else — an invalid attempt (with its cause), a nop that succeeds, an oracle that fails, a
verdict that changes between attempts — is the task's problem, in one line. One ``TaskCheck`` per
(substrate, task); its ``trust`` says who decided (``in-process`` for every Harbor task:
docs/harbor.md).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path

from drumsbench.core.outcome import Outcome
from drumsbench.envs import suites
from drumsbench.experiments.taskcheck import TaskCheck
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry

CFG = RolloutConfig(step_timeout_s=600, episode_timeout_s=1800)


def _said(outcome: Outcome, cause: object, detail: str) -> str:
    return outcome.value + (f"/{cause}" if cause else "") + (f": {detail[:200]}" if detail else "")


def check_harbor(suite: str, substrates: list[str], state_dir: Path,
                 progress: Callable[[TaskCheck], None] = lambda _c: None, repeat: int = 1) -> list[TaskCheck]:
    """Oracle 1 and nop 0 for every task on each substrate (module contract)."""
    loaded = suites.load(suite)
    out: list[TaskCheck] = []
    seq = itertools.count()
    for name in substrates:
        sub = registry.get(name)(f"check-{uuid.uuid4().hex[:8]}", state_dir)
        try:
            for task in loaded.tasks:
                said: dict[str, list[str]] = {"oracle": [], "null": []}
                problem, trust = "", ""
                for policy, want in (("null", Outcome.FAILED), ("oracle", Outcome.SUCCESS)):
                    for _ in range(max(1, repeat)):
                        slot = Slot(sub, loaded.make_env())
                        try:
                            rec = run_attempt(slot, task, make_policy(policy), CFG, CanaryRegistry(),
                                              run_id=sub.run_id, seq=next(seq), seed=0)
                        finally:
                            slot.destroy()
                        trust = str(rec.extra.get("trust", trust))
                        said[policy].append(_said(rec.outcome, rec.cause, rec.detail))
                        if rec.outcome is not want and not problem:
                            who = "nop" if policy == "null" else "oracle"
                            problem = f"{who} ended {said[policy][-1]}; want {want.value}"
                if not problem and any(len(set(v)) > 1 for v in said.values()):
                    problem = f"flaky: the verdicts changed between {repeat} attempts: {said}"
                result = TaskCheck(name, task.id, not problem, said["null"][0], said["oracle"][0], problem, trust)
                progress(result)
                out.append(result)
        finally:
            sub.close()
    return out
