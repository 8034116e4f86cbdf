"""The coding verifiers (the trusted judge; the in-process kept, warm, cold) side by side, on one
substrate (``--substrate``, default process), in one run.

    .venv/bin/python benchmarks/warm_verifier.py [--substrate vm] [--attempts 40] [--sweep] [--json out.json]

Attempts: ``--attempts`` oracle attempts per verifier, the four interleaved in rotating order
(one slot each, in-place reset, the built-in coding tasks in turn), so all see the same load.
Printed per verifier: the attempt's wall time (reset to verdict), the verify phase (stage + run)
and the runner alone (``run_verifier``: the kept server's answer, or one ``python3`` exec and the
tests), each as p50 with its 95% interval (order statistics), and each one's ratio to cold.
Every attempt must succeed (the oracle), the judge must have decided every judge attempt and the
kept verifier every kept attempt (no fallback; on a substrate whose sandboxes keep no helper,
``kept`` runs ``warm`` and every kept attempt must say so). The boundary's cost per forwarded call:
``--calls`` requests (a module attribute, then a call returning plain data) from the judge's ``Link``
to a boundary server in a sandbox of the substrate, p50 per request with its interval. Beside them, a runner's
start and imports alone (one ``python3 -I -c "import ..."`` in the sandbox per round): what the kept
server does once per sandbox.

``--sweep``: also ``drumsbench sweep --substrate process --concurrency C --window 1m --soak none``
(``--sweep-concurrency``, default ``1,2,4``) for two verifiers (``--sweep-verifiers``, default kept
and cold; ``DRUMSBENCH_VERIFIER``), ``--sweep-pairs`` pairs in ABBA order, and their valid rollouts
per host-hour at each sweep's N_max side by side with the ratio of the means.

The machine's load average is printed with the figures: on a shared 2-core host they move with it;
compare the ratios.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import VerifierResult
from drumsbench.envs.coding.env import VERIFIER_VAR, VERIFIERS, CodingEnv
from drumsbench.envs.coding.task import CodingTask, load_suite
from drumsbench.measure.stats import Estimate, quantile
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.base import Helpers

# The warm runner's work before its fork (interpreter start and imports), as one exec in the sandbox:
# what a verifier process kept from reset would no longer pay per verification.
PREPARE = "import ast, json, os, select, signal, sys, time, secrets, types, unittest"


class TimedEnv(CodingEnv):
    """A coding environment that keeps how long each ``run_verifier`` took."""

    def __init__(self, verifier: str) -> None:
        super().__init__(verifier)
        self.runner_s: list[float] = []

    def run_verifier(self, task: CodingTask, timeout: float) -> VerifierResult:
        t0 = time.monotonic()
        try:
            return super().run_verifier(task, timeout)
        finally:
            self.runner_s.append(time.monotonic() - t0)


def _ms(e: Estimate) -> str:
    return e.fmt(".1f", "ms") if e.value is None else Estimate(
        value=e.value * 1e3, low=(e.low or 0) * 1e3, high=(e.high or 0) * 1e3, n=e.n, method=e.method).fmt(".1f", "ms")


def attempts(n: int, state: Path, substrate: str = "process") -> dict[str, Any]:
    tasks = load_suite("coding")
    run = "wv-" + uuid.uuid4().hex[:6]
    cls = registry.get(substrate)
    slots = {mode: Slot(cls(f"{run}-{mode}", state), TimedEnv(mode)) for mode in VERIFIERS}
    notes: dict[str, list[str]] = {m: [] for m in VERIFIERS}
    wall: dict[str, list[float]] = {m: [] for m in VERIFIERS}
    verify: dict[str, list[float]] = {m: [] for m in VERIFIERS}
    bad: list[str] = []
    prepare: list[float] = []
    calls: list[int] = []
    canaries = CanaryRegistry()
    load0 = os.getloadavg()
    try:
        for i in range(n):
            task = tasks[i % len(tasks)]
            k = i % len(VERIFIERS)
            order = VERIFIERS[k:] + VERIFIERS[:k]
            for mode in order:
                rec = run_attempt(slots[mode], task, make_policy("oracle"), RolloutConfig(), canaries,
                                  run_id=run, seq=i, seed=0)
                if rec.outcome is not Outcome.SUCCESS:
                    bad.append(f"{mode} {task.id}: {rec.outcome} {rec.detail}")
                notes[mode].append(str(rec.extra.get("verifier")))
                if mode == "judge":
                    calls.append(int(str(rec.extra.get("judge_calls") or 0)))
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
    out: dict[str, Any] = {"substrate": substrate, "attempts_each": n, "loadavg_before": load0,
                           "loadavg_after": os.getloadavg(), "not_success": bad}
    for mode in VERIFIERS:
        env = slots[mode].env
        assert isinstance(env, TimedEnv)
        out[mode] = {"attempt_p50": quantile(wall[mode], 0.5).model_dump(),
                     "verify_phase_p50": quantile(verify[mode], 0.5).model_dump(),
                     "runner_p50": quantile(env.runner_s, 0.5).model_dump(),
                     "fallbacks": len(env.fallbacks),
                     "decided_by": {v: notes[mode].count(v) for v in sorted(set(notes[mode]))}}
    kept = "kept" if cls.sandbox_class is not None and issubclass(cls.sandbox_class, Helpers) else "warm"
    if out["kept"]["decided_by"] != {kept: n}:
        bad.append(f"kept attempts decided by {out['kept']['decided_by']}, not all by the {kept} runner")
    if out["judge"]["decided_by"] != {"judge": n}:
        bad.append(f"judge attempts decided by {out['judge']['decided_by']}, not all by the judge")
    out["judge_calls_p50"] = quantile([float(c) for c in calls], 0.5).model_dump()
    out["prepare_p50"] = quantile(prepare, 0.5).model_dump()
    for mode in ("kept", "warm"):
        for key in ("attempt_p50", "verify_phase_p50", "runner_p50"):
            out[f"ratio_{mode}_cold_{key}"] = out[mode][key]["value"] / out["cold"][key]["value"]
    for key in ("attempt_p50", "verify_phase_p50", "runner_p50"):
        out[f"ratio_judge_kept_{key}"] = out["judge"][key]["value"] / out["kept"][key]["value"]
    return out


def boundary_calls(n: int, state: Path, substrate: str = "process") -> dict[str, Any]:
    """Seconds per forwarded request, judge ``Link`` -> boundary server in a sandbox of ``substrate``."""
    from drumsbench.envs.coding.env import BOUNDARY_SERVER
    from drumsbench.envs.coding.judge import Link
    from drumsbench.substrates.base import Streaming

    sub = registry.get(substrate)("wv-calls-" + uuid.uuid4().hex[:6], state)
    box = sub.create()
    assert isinstance(box, Streaming)
    try:
        stream = box.open_stream(["python3", "-I", "-c", BOUNDARY_SERVER], cwd=box.paths.work)
        try:
            link = Link(stream.stdout_fd, stream.stdin_fd, time.monotonic() + 600)
            mod = link.request("import", name="decimal")
            per: list[float] = []
            for i in range(n):
                t0 = time.perf_counter()
                ctor = mod.Decimal  # one request: a handle
                value = ctor(str(i))  # one request: plain data back
                per.append((time.perf_counter() - t0) / 2)
                assert value == i
        finally:
            stream.close()
    finally:
        box.destroy()
        sub.close()
    return {"requests": 2 * n, "per_request_p50": quantile(per, 0.5).model_dump()}


def sweeps(state: Path, pairs: int, modes: tuple[str, str], concurrency: str) -> list[dict[str, Any]]:
    """``pairs`` pairs of sweeps, in the order A, B, then B, A, ... (ABBA), so that a load that rises
    or falls through the run does not favour one verifier."""
    out: list[dict[str, Any]] = []
    for i in range(pairs):
        for mode in modes if i % 2 == 0 else tuple(reversed(modes)):
            out.append({"verifier": mode, **_sweep(state, mode, concurrency)})
    return out


def _sweep(state: Path, mode: str, concurrency: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"sweep-{mode}-", dir=state))
    report = folder / "sweep.json"
    load0 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "drumsbench", "sweep", "--substrate", "process",
                           "--concurrency", concurrency, "--window", "1m", "--soak", "none", "--out", str(folder),
                           "--json", str(report), "--no-progress"],
                          env={**os.environ, VERIFIER_VAR: mode}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sweep with the {mode} verifier failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"report": json.loads(report.read_text()), "loadavg_before": load0,
            "loadavg_after": os.getloadavg(), "wall_s": time.monotonic() - t0, "out": str(folder)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--substrate", default="process", help="the substrate (default process)")
    ap.add_argument("--attempts", type=int, default=40, help="oracle attempts per verifier")
    ap.add_argument("--sweep", action="store_true", help="also 1-minute sweeps at concurrency 2 per verifier")
    ap.add_argument("--sweep-pairs", type=int, default=2, help="pairs of sweeps (ABBA order); default 2")
    ap.add_argument("--sweep-verifiers", default="kept,cold", help="the two verifiers swept; default kept,cold")
    ap.add_argument("--sweep-concurrency", default="1,2,4", help="the sweeps' concurrency list; default 1,2,4")
    ap.add_argument("--calls", type=int, default=2000, help="pairs of forwarded requests timed alone")
    ap.add_argument("--state", type=Path, default=None, help="state folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.substrate not in registry.names():
        ap.error(f"--substrate: {args.substrate!r} is not one of {', '.join(registry.names())}")
    if (why := registry.get(args.substrate).missing()) is not None:
        ap.error(f"--substrate {args.substrate}: {why}")
    modes = tuple(args.sweep_verifiers.split(","))
    if len(modes) != 2 or not set(modes) <= set(VERIFIERS) or modes[0] == modes[1]:
        ap.error(f"--sweep-verifiers: give two of {', '.join(VERIFIERS)}, e.g. kept,cold")
    state = args.state or Path(tempfile.mkdtemp(prefix="warm-verifier-"))
    if args.state is None:  # its own temporary folder: gone at exit (it was left in /tmp)
        atexit.register(shutil.rmtree, state, True)
    state.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine_cpus": os.cpu_count(),
                              "attempts": attempts(args.attempts, state, args.substrate)}
    a = result["attempts"]
    print(f"oracle coding attempts on {args.substrate}, {a['attempts_each']} per verifier, interleaved; "
          f"load {a['loadavg_before'][0]:.1f} -> {a['loadavg_after'][0]:.1f} on {os.cpu_count()} cpus")
    print(f"{'':10} {'attempt p50':>30} {'verify phase p50':>30} {'runner p50':>30}  fallbacks, decided by")
    for mode in VERIFIERS:
        row = [_ms(Estimate(**a[mode][k])) for k in ("attempt_p50", "verify_phase_p50", "runner_p50")]
        print(f"{mode:10} {row[0]:>30} {row[1]:>30} {row[2]:>30}  {a[mode]['fallbacks']}, {a[mode]['decided_by']}")
    for mode in ("kept", "warm"):
        print(f"{mode + '/cold':10} " + " ".join(f"{a[f'ratio_{mode}_cold_{k}']:>30.2f}"
                                                  for k in ("attempt_p50", "verify_phase_p50", "runner_p50")))
    print(f"{'judge/kept':10} " + " ".join(f"{a[f'ratio_judge_kept_{k}']:>30.2f}"
                                          for k in ("attempt_p50", "verify_phase_p50", "runner_p50")))
    print(f"forwarded requests per judge verification: p50 {Estimate(**a['judge_calls_p50']).fmt('.0f')}")
    result["boundary"] = boundary_calls(args.calls, state, args.substrate)
    per = Estimate(**result["boundary"]["per_request_p50"])
    us = Estimate(value=(per.value or 0) * 1e6, low=(per.low or 0) * 1e6, high=(per.high or 0) * 1e6, n=per.n,
                  method=per.method)
    print(f"one forwarded request (judge Link -> boundary server in a {args.substrate} sandbox), "
          f"{result['boundary']['requests']} requests: p50 {us.fmt('.0f', 'us')}")
    prep = Estimate(**a["prepare_p50"])
    print(f"a runner's start and imports alone (python3 -I -c 'import ...' in the sandbox): {_ms(prep)} "
          "(paid once per sandbox by the kept server, per verification by warm and cold)")
    if a["not_success"]:
        print("NOT SUCCESS:", *a["not_success"], sep="\n  ")
    if args.sweep:
        result["sweeps"] = sweeps(state, args.sweep_pairs, modes, args.sweep_concurrency)  # type: ignore[arg-type]
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for s in result["sweeps"]:
            n_max = s["report"]["n_max"]
            for w in s["report"]["windows"]:
                e = Estimate(**w["valid_per_host_hour"])
                if w["concurrency"] == n_max:
                    rates[s["verifier"]].append(e.value or 0.0)
                print(f"sweep {s['verifier']}: N={w['concurrency']}{' (N_max)' if w['concurrency'] == n_max else ''} "
                      f"{w['valid']}/{w['attempts']} valid in {w['ran_s']:.0f} s, valid/host-hour {e.fmt('.0f')}, "
                      f"confirmed {w['confirmed']}; load {s['loadavg_before'][0]:.1f} -> {s['loadavg_after'][0]:.1f}")
        if all(rates[m] for m in modes):
            mean = {m: sum(v) / len(v) for m, v in rates.items()}
            key = f"sweep_ratio_{modes[0]}_{modes[1]}"
            result[key] = mean[modes[0]] / mean[modes[1]]
            print(f"sweep {modes[0]}/{modes[1]} valid rollouts per host-hour at N_max "
                  f"(mean of {len(rates[modes[0]])} each): {result[key]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if a["not_success"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
