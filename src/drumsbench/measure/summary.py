"""Build a run's report model from the ledger alone.

The JSON report is this model (``RunReport``), versioned by ``schema``; docs/report-schema.md
describes it. Nothing here reads anything but the ledger.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from pydantic import BaseModel

from drumsbench.ledger import Ledger
from drumsbench.measure.cost import DEFAULT_PRICE, HostPrice, usd_per_valid_rollout
from drumsbench.measure.stats import Estimate, quantile, rate_per_hour, scale, wilson
from drumsbench.outcome import InvalidCause

REPORT_SCHEMA = "drumsbench.run-report/1"
PHASES = ("provision", "reset", "step", "verify", "teardown", "attempt")


class PhaseLatency(BaseModel):
    n: int
    p50: Estimate
    p95: Estimate
    p99: Estimate


class TaskLine(BaseModel):
    attempts: int
    success: int
    failed: int
    invalid: int


class HostLine(BaseModel):
    """One host (a machine, by hostname) of a run; several Ray nodes on one machine are one host."""

    attempts: int
    success: int
    failed: int
    invalid: int
    nodes: int  # distinct Ray nodes seen on this host (1 in process)
    valid_per_host_hour: Estimate


class Control(BaseModel):
    window: str
    kind: str
    fired: bool
    detail: str


class RunReport(BaseModel):
    schema_: str = REPORT_SCHEMA
    run_id: str
    kind: str
    status: str
    machine: dict[str, Any]
    commit: str
    config: dict[str, Any]
    host_seconds: float
    segments: int
    attempts: int
    valid: int
    success: int
    failed: int
    invalid_total: int
    invalid: dict[str, int]
    injected: dict[str, int]
    injected_caught: dict[str, int]
    invalid_not_injected: int
    success_rate: Estimate
    invalid_rate: Estimate
    valid_per_host_hour: Estimate
    price: HostPrice
    usd_per_valid_rollout: Estimate
    inference_cost: str = "excluded: host cost only (inference is not part of this figure)"
    phases: dict[str, PhaseLatency]
    tasks: dict[str, TaskLine]
    controls: list[Control]
    isolation_confirmed: bool
    conditions: str
    # host-hours = hosts x wall hours: ``host_seconds`` = ``host_count`` x ``wall_seconds``
    wall_seconds: float = 0.0
    host_count: int = 1
    hosts: dict[str, HostLine] = {}

    model_config = {"populate_by_name": True}

    def dump(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["schema"] = d.pop("schema_")
        return d


def _latency(values: list[float]) -> PhaseLatency:
    arr = np.asarray(values, dtype=float)
    return PhaseLatency(n=len(arr), p50=quantile(arr, 0.5), p95=quantile(arr, 0.95), p99=quantile(arr, 0.99))


def build(ledger: Ledger, run_id: str, price: HostPrice | None = None) -> RunReport:
    run = ledger.run(run_id)
    cfg = run["config"]
    if price is None:
        price = HostPrice(**cfg["price"]) if "price" in cfg else DEFAULT_PRICE
    segs = ledger.segments(run_id)
    wall_s = sum(max(0.0, e - s) for s, e, _ in segs)
    cols = ("task", "outcome", "cause", "injected", "t_end", "provision_s", "reset_s", "steps_s",
            "verify_s", "teardown_s", "t_start", "host", "extra")
    rows = ledger.attempts(run_id, cols)

    invalid = {c.value: 0 for c in InvalidCause}
    injected = {c.value: 0 for c in InvalidCause}
    caught = {c.value: 0 for c in InvalidCause}
    tasks: dict[str, TaskLine] = {}
    not_injected = 0
    success = failed = 0
    valid_times: list[float] = []
    phase_values: dict[str, list[float]] = {p: [] for p in PHASES}
    per_host: dict[str, list[Any]] = {}  # host -> [attempts, success, failed, invalid, nodes, valid times]
    for task, outcome, cause, inj, t_end, prov, reset, steps, verify, teardown, t_start, host, extra in rows:
        line = tasks.setdefault(task, TaskLine(attempts=0, success=0, failed=0, invalid=0))
        line.attempts += 1
        h = per_host.setdefault(host, [0, 0, 0, 0, set(), []])
        h[0] += 1
        h[{"success": 1, "failed": 2}.get(outcome, 3)] += 1
        h[4].add(json.loads(extra or "{}").get("node", ""))
        if outcome != "invalid":
            h[5].append(_offset(segs, t_end))
        if inj:
            injected[inj] += 1
            if cause == inj:
                caught[inj] += 1
        if outcome == "invalid":
            invalid[cause] += 1
            line.invalid += 1
            if not inj:
                not_injected += 1
        else:
            valid_times.append(_offset(segs, t_end))
            if outcome == "success":
                success += 1
                line.success += 1
            else:
                failed += 1
                line.failed += 1
        if prov:
            phase_values["provision"].append(prov)
        phase_values["reset"].append(reset)
        phase_values["step"].extend(json.loads(steps))
        if verify:
            phase_values["verify"].append(verify)
        if teardown:
            phase_values["teardown"].append(teardown)
        phase_values["attempt"].append(t_end - t_start)

    n = len(rows)
    valid = success + failed
    host_count = max(1, len(per_host))
    host_s = wall_s * host_count
    throughput = scale(rate_per_hour(valid_times, wall_s), 1 / host_count)  # per host-hour
    hosts = {h: HostLine(attempts=v[0], success=v[1], failed=v[2], invalid=v[3], nodes=len(v[4]),
                         valid_per_host_hour=rate_per_hour(v[5], wall_s)) for h, v in sorted(per_host.items())}
    controls = [Control(**c) for c in ledger.controls(run_id)]
    machine = run["machine"]
    executor = cfg.get("executor", "local")
    spread = "" if executor == "local" else f" per node, executor {executor} on {host_count} host(s)"
    conditions = (f"{cfg.get('substrate', '?')} substrate, concurrency {cfg.get('concurrency', '?')}{spread}, "
                  f"policy {cfg.get('policy', '?')}, on {machine.get('cores', '?')} cores "
                  f"({machine.get('cpu_model', '?')}), {machine.get('os', '?')}, commit {run['commit']}; "
                  f"95% intervals")
    return RunReport(
        run_id=run_id,
        kind=run["kind"],
        status=run["status"],
        machine=machine,
        commit=run["commit"],
        config=cfg,
        host_seconds=host_s,
        segments=len(segs),
        attempts=n,
        valid=valid,
        success=success,
        failed=failed,
        invalid_total=n - valid,
        invalid=invalid,
        injected=injected,
        injected_caught=caught,
        invalid_not_injected=not_injected,
        success_rate=wilson(success, valid),
        invalid_rate=wilson(n - valid, n),
        valid_per_host_hour=throughput,
        price=price,
        usd_per_valid_rollout=usd_per_valid_rollout(price, throughput),
        phases={p: _latency(v) for p, v in phase_values.items()},
        tasks=dict(sorted(tasks.items())),
        controls=controls,
        isolation_confirmed=bool(controls) and all(c.fired for c in controls if c.kind == "isolation"),
        conditions=conditions,
        wall_seconds=wall_s,
        host_count=host_count,
        hosts=hosts,
    )


def _offset(segs: list[tuple[float, float, str]], t: float) -> float:
    """Position of wall time ``t`` on the run's timeline of concatenated segments."""
    before = 0.0
    for start, end, _ in segs:
        if t <= end or (start, end) == segs[-1][:2]:
            return before + max(0.0, min(t, end) - start)
        before += end - start
    return before
