"""The red team against the trusted judge, every strategy on every built-in coding task, with its
positive control (issue 29's "must show").

    .venv/bin/python benchmarks/redteam_matrix.py [--substrates process,bwrap,docker,podman]
        [--tasks all|ID,...] [--strategies all|forging|NAME,...] [--no-naive] [--json out.json]

Per substrate: every coding strategy (``policies.adversary.STRATEGIES``) on every task with the
default environment (the judge where the substrate streams) — each attempt must end **failed**; then
every forging strategy (``policies.adversary.FORGING``) with the NAIVE
verifier (``testing.naive_verifier``) — each must reach **success** on at least one task (a
strategy that wins nowhere tests nothing; where its mechanism needs what the substrate lacks, e.g. a
compiler in the container image, the table says so). Prints one line per strategy: judge outcomes
(failed / success / invalid) and naive successes over tasks, and the oracle/null control per task.
Exit 1 when a strategy reached success or invalid against the judge.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from drumsbench.core.outcome import Outcome
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.adversary import FORGING, STRATEGIES, Adversary
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.testing.naive_verifier import NaiveCodingEnv

CFG = RolloutConfig(step_timeout_s=3.0, episode_timeout_s=60.0, verify_timeout_s=15.0, max_steps=60)


def _pick(given: str, every: list[str]) -> list[str]:
    return every if given == "all" else [x for x in given.split(",") if x]


def run_substrate(name: str, tasks: list[Any], strategies: list[str], state: Path,
                  naive_too: bool = True) -> dict[str, Any]:
    run_id = f"rtm-{name}-{uuid.uuid4().hex[:6]}"
    canaries = CanaryRegistry()
    seq = iter(range(10**6))
    judged: dict[str, Counter[str]] = {s: Counter() for s in strategies}
    trust: Counter[str] = Counter()
    naive: dict[str, Counter[str]] = {s: Counter() for s in FORGING if s in strategies and naive_too}
    controls: dict[str, str] = {}
    escapes: list[str] = []
    t0 = time.monotonic()
    slot = Slot(registry.get(name)(run_id, state), CodingEnv())
    try:
        for task in tasks:
            for s in strategies:
                rec = run_attempt(slot, task, Adversary([s]), CFG, canaries, run_id=run_id, seq=next(seq), seed=0)
                judged[s][rec.outcome.value] += 1
                trust[str(rec.extra.get("trust"))] += 1
                if rec.outcome is not Outcome.FAILED:
                    escapes.append(f"{s} on {task.id}: {rec.outcome.value} {rec.cause or ''} {rec.detail[:160]}")
            oracle = run_attempt(slot, task, make_policy("oracle"), CFG, canaries, run_id=run_id, seq=next(seq), seed=0)
            null = run_attempt(slot, task, make_policy("null"), CFG, canaries, run_id=run_id, seq=next(seq), seed=0)
            controls[task.id] = f"oracle {oracle.outcome.value}, null {null.outcome.value}"
            print(f"  {name} {task.id}: judge done ({controls[task.id]}), {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        slot.destroy()
        slot.substrate.close()
    slot = Slot(registry.get(name)(run_id + "-naive", state), NaiveCodingEnv())
    try:
        for task in tasks:
            for s in naive:
                rec = run_attempt(slot, task, Adversary([s]), CFG, canaries, run_id=run_id, seq=next(seq), seed=0)
                naive[s][rec.outcome.value] += 1
        print(f"  {name}: naive done, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        slot.destroy()
        slot.substrate.close()
    return {"judged": {s: dict(c) for s, c in judged.items()}, "naive": {s: dict(c) for s, c in naive.items()},
            "trust": dict(trust), "controls": controls, "escapes": escapes, "seconds": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--substrates", default="process,bwrap,docker,podman")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--strategies", default="all")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive verifier's positive controls")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    all_tasks = load_suite("coding")
    tasks = [t for t in all_tasks if t.id in set(_pick(args.tasks, [t.id for t in all_tasks]))]
    strategies = list(FORGING) if args.strategies == "forging" else _pick(args.strategies, list(STRATEGIES))
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="drumsbench-rtm-") as tmp:
        for name in _pick(args.substrates, []):
            missing = registry.get(name).missing()
            if missing:
                raise SystemExit(f"--substrates: {name} is not usable here: {missing}")
            result[name] = run_substrate(name, tasks, strategies, Path(tmp), not args.no_naive)
    bad = False
    for name, r in result.items():
        print(f"\n{name}: {len(tasks)} tasks x {len(strategies)} strategies in {r['seconds']:.0f} s; "
              f"verdicts by {r['trust']}")
        print(f"{'strategy':28} {'judge: failed/success/invalid':>30} {'naive: success of tasks':>26}")
        for s in strategies:
            j = r["judged"][s]
            n = r["naive"].get(s)
            nv = f"{n.get('success', 0)}/{sum(n.values())}" if n is not None else (
                "(not forging)" if s not in FORGING else "(not run)")
            print(f"{s:28} {j.get('failed', 0):>14}/{j.get('success', 0)}/{j.get('invalid', 0):<13} {nv:>26}")
        bad_controls = {t: c for t, c in r["controls"].items() if c != "oracle success, null failed"}
        print(f"controls: {len(r['controls']) - len(bad_controls)}/{len(r['controls'])} tasks oracle success "
              f"and null failed{'; ' + str(bad_controls) if bad_controls else ''}")
        for e in r["escapes"]:
            print("ESCAPE", name, e)
        bad = bad or bool(r["escapes"]) or bool(bad_controls)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
