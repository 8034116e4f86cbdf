"""Cold and warm coding verifier side by side, on the process substrate, in one run.

    .venv/bin/python benchmarks/warm_verifier.py [--attempts 40] [--sweep] [--json out.json]

Attempts: ``--attempts`` oracle attempts per verifier, cold and warm interleaved (one slot each,
in-place reset, the built-in coding tasks in turn), so both see the same load. Printed per verifier:
the attempt's wall time (reset to verdict), the verify phase (stage + run) and the runner alone
(``run_verifier``: one ``python3`` exec and the tests), each as p50 with its 95% interval
(order statistics), and the warm/cold ratio of the p50s. Every attempt must succeed (the oracle).
Beside them, the warm runner's start and imports alone (one ``python3 -I -c "import ..."`` in the
sandbox per round): the part of the runner a verifier process kept from reset would not pay.

``--sweep``: also ``drumsbench sweep --substrate process --concurrency 2 --window 1m --soak none``
per verifier (``DRUMSBENCH_VERIFIER``), ``--sweep-pairs`` pairs in ABBA order (warm, cold, cold,
warm, ...), and their valid rollouts per host-hour side by side with the ratio of the means.

The machine's load average is printed with the figures: on a shared 2-core host they move with it;
compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import Task
from drumsbench.envs.coding.env import VERIFIER_VAR, VERIFIERS, CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.measure.stats import Estimate, quantile
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.process import ProcessSubstrate

# The warm runner's work before its fork (interpreter start and imports), as one exec in the sandbox:
# what a verifier process kept from reset would no longer pay per verification.
PREPARE = "import ast, json, os, select, signal, sys, time, secrets, types, unittest"


class TimedEnv(CodingEnv):
    """A coding environment that keeps how long each ``run_verifier`` took."""

    def __init__(self, verifier: str) -> None:
        super().__init__(verifier)
        self.runner_s: list[float] = []

    def run_verifier(self, task: Task, timeout: float) -> bool:
        t0 = time.monotonic()
        try:
            return super().run_verifier(task, timeout)
        finally:
            self.runner_s.append(time.monotonic() - t0)


def _ms(e: Estimate) -> str:
    return e.fmt(".1f", "ms") if e.value is None else Estimate(
        value=e.value * 1e3, low=(e.low or 0) * 1e3, high=(e.high or 0) * 1e3, n=e.n, method=e.method).fmt(".1f", "ms")


def attempts(n: int, state: Path) -> dict[str, Any]:
    tasks = load_suite("coding")
    run = "wv-" + uuid.uuid4().hex[:6]
    slots = {mode: Slot(ProcessSubstrate(f"{run}-{mode}", state), TimedEnv(mode)) for mode in VERIFIERS}
    wall: dict[str, list[float]] = {m: [] for m in VERIFIERS}
    verify: dict[str, list[float]] = {m: [] for m in VERIFIERS}
    bad: list[str] = []
    prepare: list[float] = []
    canaries = CanaryRegistry()
    load0 = os.getloadavg()
    try:
        for i in range(n):
            task = tasks[i % len(tasks)]
            order = VERIFIERS if i % 2 == 0 else tuple(reversed(VERIFIERS))
            for mode in order:
                rec = run_attempt(slots[mode], task, make_policy("oracle"), RolloutConfig(), canaries,
                                  run_id=run, seq=i, seed=0)
                if rec.outcome is not Outcome.SUCCESS:
                    bad.append(f"{mode} {task.id}: {rec.outcome} {rec.detail}")
                wall[mode].append(rec.t_end - rec.t_start)
                verify[mode].append(rec.verify_s)
            box = slots["warm"].sandbox
            if box is not None:  # what the warm runner does before its fork, alone
                t0 = time.monotonic()
                res = box.exec(["python3", "-I", "-c", PREPARE], timeout=60)
                if res.exit_code == 0:
                    prepare.append(time.monotonic() - t0)
    finally:
        for slot in slots.values():
            slot.destroy()
            slot.substrate.close()
    out: dict[str, Any] = {"attempts_each": n, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                           "not_success": bad}
    for mode in VERIFIERS:
        env = slots[mode].env
        assert isinstance(env, TimedEnv)
        out[mode] = {"attempt_p50": quantile(wall[mode], 0.5).model_dump(),
                     "verify_phase_p50": quantile(verify[mode], 0.5).model_dump(),
                     "runner_p50": quantile(env.runner_s, 0.5).model_dump(),
                     "fallbacks": len(env.fallbacks)}
    out["prepare_p50"] = quantile(prepare, 0.5).model_dump()
    for key in ("attempt_p50", "verify_phase_p50", "runner_p50"):
        out[f"ratio_{key}"] = out["warm"][key]["value"] / out["cold"][key]["value"]
    return out


def sweeps(state: Path, pairs: int) -> list[dict[str, Any]]:
    """``pairs`` pairs of sweeps, in the order warm, cold, then cold, warm, ... (ABBA), so that a load
    that rises or falls through the run does not favour one verifier."""
    out: list[dict[str, Any]] = []
    for i in range(pairs):
        for mode in VERIFIERS if i % 2 == 0 else tuple(reversed(VERIFIERS)):
            out.append({"verifier": mode, **_sweep(state, mode)})
    return out


def _sweep(state: Path, mode: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"sweep-{mode}-", dir=state))
    report = folder / "sweep.json"
    load0 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "drumsbench", "sweep", "--substrate", "process",
                           "--concurrency", "2", "--window", "1m", "--soak", "none", "--out", str(folder),
                           "--json", str(report), "--no-progress"],
                          env={**os.environ, VERIFIER_VAR: mode}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sweep with the {mode} verifier failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"report": json.loads(report.read_text()), "loadavg_before": load0,
            "loadavg_after": os.getloadavg(), "wall_s": time.monotonic() - t0, "out": str(folder)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=40, help="oracle attempts per verifier")
    ap.add_argument("--sweep", action="store_true", help="also 1-minute sweeps at concurrency 2 per verifier")
    ap.add_argument("--sweep-pairs", type=int, default=2, help="pairs of sweeps (ABBA order); default 2")
    ap.add_argument("--state", type=Path, default=None, help="state folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    state = args.state or Path(tempfile.mkdtemp(prefix="warm-verifier-"))
    state.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine_cpus": os.cpu_count(), "attempts": attempts(args.attempts, state)}
    a = result["attempts"]
    print(f"oracle coding attempts on process, {a['attempts_each']} per verifier, interleaved; "
          f"load {a['loadavg_before'][0]:.1f} -> {a['loadavg_after'][0]:.1f} on {os.cpu_count()} cpus")
    print(f"{'':6} {'attempt p50':>30} {'verify phase p50':>30} {'runner p50':>30}  fallbacks")
    for mode in VERIFIERS:
        row = [_ms(Estimate(**a[mode][k])) for k in ("attempt_p50", "verify_phase_p50", "runner_p50")]
        print(f"{mode:6} {row[0]:>30} {row[1]:>30} {row[2]:>30}  {a[mode]['fallbacks']}")
    print(f"{'warm/cold':10} {a['ratio_attempt_p50']:>26.2f} {a['ratio_verify_phase_p50']:>30.2f} "
          f"{a['ratio_runner_p50']:>30.2f}")
    prep = Estimate(**a["prepare_p50"])
    print(f"the warm runner's start and imports alone (python3 -I -c 'import ...' in the sandbox): {_ms(prep)}; "
          f"warm runner minus that: {(a['warm']['runner_p50']['value'] - (prep.value or 0)) * 1e3:.1f} ms "
          f"(what a verifier process kept from reset would cost)")
    if a["not_success"]:
        print("NOT SUCCESS:", *a["not_success"], sep="\n  ")
    if args.sweep:
        result["sweeps"] = sweeps(state, args.sweep_pairs)
        rates: dict[str, list[float]] = {m: [] for m in VERIFIERS}
        for s in result["sweeps"]:
            for w in s["report"]["windows"]:
                e = Estimate(**w["valid_per_host_hour"])
                rates[s["verifier"]].append(e.value or 0.0)
                print(f"sweep {s['verifier']}: N={w['concurrency']} {w['valid']}/{w['attempts']} valid in "
                      f"{w['ran_s']:.0f} s, valid/host-hour {e.fmt('.0f')}, confirmed {w['confirmed']}; "
                      f"load {s['loadavg_before'][0]:.1f} -> {s['loadavg_after'][0]:.1f}")
        if rates["cold"] and rates["warm"]:
            mean = {m: sum(v) / len(v) for m, v in rates.items()}
            result["sweep_ratio_warm_cold"] = mean["warm"] / mean["cold"]
            print(f"sweep warm/cold valid rollouts per host-hour (mean of {len(rates['warm'])} each): "
                  f"{result['sweep_ratio_warm_cold']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if a["not_success"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
