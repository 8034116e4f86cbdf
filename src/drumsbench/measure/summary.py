"""Build a run's report model from the ledger alone.

The JSON report is this model (``RunReport``), versioned by ``schema``; docs/report-schema.md
describes it. Nothing here reads anything but the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from drumsbench.core.outcome import InvalidCause
from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import WHOLE_RUN
from drumsbench.measure.cost import DEFAULT_PRICE, HostPrice, usd_per_valid_rollout
from drumsbench.measure.stats import Estimate, quantile, rate_per_hour, scale, wilson

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


class NodeRunLine(BaseModel):
    """One Ray node of a run (by node id): its attempts and valid rollouts per hour of the run's wall time."""

    host: str
    attempts: int
    valid: int
    invalid: int
    lost: int  # in flight when the node was lost (invalid/substrate_failure)
    valid_per_node_hour: Estimate


class Control(BaseModel):
    window: str
    kind: str
    fired: bool
    detail: str


class SabotageLine(BaseModel):
    """The red team's result on one substrate and environment (``--policy adversary``): which of
    its strategies reached success or invalid (both must be empty). Attempts with an injected fault
    are left out (their invalid is the injector's)."""

    substrate: str
    env: str
    attempts: int
    strategies: list[str]
    reached_success: list[str]
    reached_invalid: list[str]


class WayLine(BaseModel):
    """Attempts grouped by how one of their phases ran, from their ``extra``: ``aspect`` ``reset``
    (``restore`` or ``cold``: a desktop reset by restore, or its cold fallback) or ``verifier``
    (``warm`` or ``cold``: the coding verifier, or its cold fallback); ``latency`` is that phase's."""

    aspect: str
    way: str
    attempts: int
    invalid: int
    latency: PhaseLatency


# extra key -> (aspect, the attempt column of its phase)
WAYS = {"reset": ("reset", "reset_s"), "verifier": ("verifier", "verify_s"), "trust": ("trust", "verify_s"),
        "office": ("office", "verify_s")}  # office: who the desktop's LibreOffice ran as


class RunHeader(BaseModel):
    """What every report of a run starts with: its schema, the run, its status, machine, commit and config."""

    schema_: str
    run_id: str
    kind: str
    status: str
    machine: dict[str, Any]
    commit: str
    config: dict[str, Any]


class RunReport(RunHeader):
    schema_: str = REPORT_SCHEMA
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
    headline_basis: str = WHOLE_RUN  # a plain run's throughput and USD are over the whole run, never a window
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
    nodes: dict[str, NodeRunLine] = {}  # Ray: per node id (empty in process)
    sabotage: list[SabotageLine] = []
    ways: list[WayLine] = []  # attempts by how their reset / verifier ran (empty when no attempt says)
    # verdicts (valid attempts) by who decided them (extra "trust": "judge", "in-process", "in-sandbox";
    # "not recorded" for attempts that say nothing)
    trust: dict[str, int] = {}

    def trust_line(self) -> str:
        """``N of M verdicts from a trusted judge`` (and what decided the others)."""
        judged = self.trust.get("judge", 0)
        others = ", ".join(f"{n} {k}" for k, n in sorted(self.trust.items()) if k != "judge" and n)
        return f"{judged} of {self.valid} verdicts from a trusted judge" + (f" ({others})" if others else "")

    model_config = {"populate_by_name": True}

    def dump(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["schema"] = d.pop("schema_")
        return d


def _latency(values: list[float] | np.ndarray) -> PhaseLatency:
    arr = np.sort(np.asarray(values, dtype=float))
    return PhaseLatency(n=len(arr), p50=quantile(arr, 0.5), p95=quantile(arr, 0.95), p99=quantile(arr, 0.99))


@dataclass
class Columns:
    """A run's attempt columns as arrays, fetched once (for the run report and the HTML report)."""

    substrate: np.ndarray  # str
    window: np.ndarray  # str
    ok: np.ndarray  # bool: valid (success or failed)
    provision: np.ndarray
    reset: np.ndarray
    verify: np.ndarray
    teardown: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    steps: dict[str, np.ndarray]  # substrate -> every step's seconds


def columns(ledger: Ledger, run_id: str) -> Columns:
    db = ledger.db
    rows = db.execute("SELECT substrate, window, outcome != 'invalid', provision_s, reset_s, verify_s, teardown_s, "
                      "t_start, t_end FROM attempts WHERE run_id = ?", (run_id,)).fetchall()
    cols = list(zip(*rows, strict=True)) if rows else [()] * 9
    del rows
    prov, reset, verify, teardown, t_start, t_end = (np.array(x, dtype=float) for x in cols[3:])
    # steps from the stored JSON text, one string per substrate (exact: the text is each float's repr)
    steps = {sub: np.array(text.split(","), dtype=float) for sub, text in db.execute(
        "SELECT substrate, group_concat(substr(steps_s, 2, length(steps_s) - 2), ',') FROM attempts "
        "WHERE run_id = ? AND n_steps > 0 GROUP BY substrate", (run_id,)) if text}
    return Columns(np.array(cols[0], dtype=str), np.array(cols[1], dtype=str), np.array(cols[2], dtype=bool),
                   prov, reset, verify, teardown, t_start, t_end, steps)


def build(ledger: Ledger, run_id: str, price: HostPrice | None = None, cols: Columns | None = None) -> RunReport:
    run = ledger.run(run_id)
    cfg = run["config"]
    if price is None:
        price = HostPrice(**cfg["price"]) if "price" in cfg else DEFAULT_PRICE
    segs = ledger.segments(run_id)
    wall_s = sum(max(0.0, e - s) for s, e, _ in segs)
    db = ledger.db

    # Counts: one GROUP BY instead of a pass over every attempt in Python (100,000 attempts in ms).
    invalid = {c.value: 0 for c in InvalidCause}
    injected = {c.value: 0 for c in InvalidCause}
    caught = {c.value: 0 for c in InvalidCause}
    tasks: dict[str, TaskLine] = {}
    not_injected = 0
    success = failed = n = 0
    for task, outcome, cause, inj, k in db.execute(
            "SELECT task, outcome, cause, injected, COUNT(*) FROM attempts WHERE run_id = ? "
            "GROUP BY task, outcome, cause, injected", (run_id,)):
        n += k
        line = tasks.setdefault(task, TaskLine(attempts=0, success=0, failed=0, invalid=0))
        line.attempts += k
        if inj:
            injected[inj] += k
            if cause == inj:
                caught[inj] += k
        if outcome == "invalid":
            invalid[cause] += k
            line.invalid += k
            if not inj:
                not_injected += k
        elif outcome == "success":
            success += k
            line.success += k
        else:
            failed += k
            line.failed += k

    # Phase timings as arrays. Quantiles do not depend on order, so none is imposed.
    c = cols if cols is not None else columns(ledger, run_id)
    prov, verify, teardown = c.provision, c.verify, c.teardown
    steps = np.concatenate(list(c.steps.values())) if c.steps else np.empty(0)
    phase_values = {"provision": prov[prov != 0], "reset": c.reset, "step": steps, "verify": verify[verify != 0],
                    "teardown": teardown[teardown != 0], "attempt": c.t_end - c.t_start}
    valid_times = _offsets(segs, c.t_end[c.ok])

    valid = success + failed
    hosts = _hosts(db, run_id, segs, wall_s)
    host_count = max(1, len(hosts))
    host_s = wall_s * host_count  # host-hours = hosts x hours
    throughput = scale(rate_per_hour(valid_times, wall_s), 1 / host_count)  # per host-hour
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
        nodes=_nodes(db, run_id, segs, wall_s),
        sabotage=_sabotage(db, run_id),
        ways=_ways(db, run_id),
        trust=_trust(db, run_id),
    )


def _trust(db: Any, run_id: str) -> dict[str, int]:
    """Valid attempts by the trust level of their verdict (``extra.trust``)."""
    return {str(level or "not recorded"): k for level, k in db.execute(
        "SELECT json_extract(extra, '$.trust') AS t, COUNT(*) FROM attempts WHERE run_id = ? "
        "AND outcome != 'invalid' GROUP BY t ORDER BY t", (run_id,))}


def _ways(db: Any, run_id: str) -> list[WayLine]:
    """Attempts by the way their reset or verifier ran (``WAYS``), with that phase's latency."""
    lines: list[WayLine] = []
    for key, (aspect, column) in WAYS.items():
        groups: dict[str, tuple[list[float], list[bool]]] = {}
        for way, seconds, outcome in db.execute(
                f"SELECT json_extract(extra, '$.{key}') AS w, {column}, outcome FROM attempts "
                "WHERE run_id = ? AND w IS NOT NULL", (run_id,)):
            times, invalid = groups.setdefault(str(way), ([], []))
            times.append(seconds)
            invalid.append(outcome == "invalid")
        lines += [WayLine(aspect=aspect, way=way, attempts=len(t), invalid=sum(bad), latency=_latency(t))
                  for way, (t, bad) in sorted(groups.items())]
    return lines


def _sabotage(db: Any, run_id: str) -> list[SabotageLine]:
    lines: dict[tuple[str, str], SabotageLine] = {}
    for substrate, env, strategy, outcome, k in db.execute(
            "SELECT substrate, env, json_extract(extra, '$.strategy') AS s, outcome, COUNT(*) FROM attempts "
            "WHERE run_id = ? AND injected IS NULL AND s IS NOT NULL GROUP BY substrate, env, s, outcome",
            (run_id,)):
        line = lines.setdefault((substrate, env), SabotageLine(substrate=substrate, env=env, attempts=0, strategies=[],
                                                                reached_success=[], reached_invalid=[]))
        line.attempts += k
        if strategy not in line.strategies:
            line.strategies.append(strategy)
        if outcome == "success" and strategy not in line.reached_success:
            line.reached_success.append(strategy)
        if outcome == "invalid" and strategy not in line.reached_invalid:
            line.reached_invalid.append(strategy)
    return [lines[k] for k in sorted(lines)]


def _hosts(db: Any, run_id: str, segs: list[tuple[float, float, str]], wall_s: float) -> dict[str, HostLine]:
    """Per host (hostname): counts, Ray nodes seen, valid rollouts per hour of that host."""
    lines: dict[str, dict[str, int]] = {}
    for host, outcome, k in db.execute("SELECT host, outcome, COUNT(*) FROM attempts WHERE run_id = ? "
                                       "GROUP BY host, outcome", (run_id,)):
        lines.setdefault(host, {"success": 0, "failed": 0, "invalid": 0})[outcome] = k
    nodes = dict(db.execute("SELECT host, COUNT(DISTINCT COALESCE(json_extract(extra, '$.node'), '')) "
                            "FROM attempts WHERE run_id = ? GROUP BY host", (run_id,)).fetchall())
    ends: dict[str, list[float]] = {}
    for host, t_end in db.execute("SELECT host, t_end FROM attempts WHERE run_id = ? AND outcome != 'invalid'",
                                  (run_id,)):
        ends.setdefault(host, []).append(t_end)
    return {h: HostLine(attempts=sum(v.values()), success=v["success"], failed=v["failed"], invalid=v["invalid"],
                        nodes=nodes.get(h, 1),
                        valid_per_host_hour=rate_per_hour(_offsets(segs, np.array(ends.get(h, []), dtype=float)),
                                                          wall_s))
            for h, v in sorted(lines.items())}


def _nodes(db: Any, run_id: str, segs: list[tuple[float, float, str]], wall_s: float) -> dict[str, NodeRunLine]:
    """Per Ray node: counts and valid rollouts per hour of the run's wall time (a node is not a host)."""
    rows: dict[str, dict[str, Any]] = {}
    for node, host, outcome, lost, t_end in db.execute(
            "SELECT json_extract(extra, '$.node') AS n, host, outcome, "
            "COALESCE(json_extract(extra, '$.lost_node'), 0), t_end FROM attempts WHERE run_id = ? AND n IS NOT NULL",
            (run_id,)):
        d = rows.setdefault(node, {"host": host, "attempts": 0, "invalid": 0, "lost": 0, "ends": []})
        d["attempts"] += 1
        d["lost"] += bool(lost)
        if outcome == "invalid":
            d["invalid"] += 1
        else:
            d["ends"].append(t_end)
    return {node: NodeRunLine(host=d["host"], attempts=d["attempts"], valid=len(d["ends"]), invalid=d["invalid"],
                              lost=d["lost"],
                              valid_per_node_hour=rate_per_hour(_offsets(segs, np.array(d["ends"], dtype=float)),
                                                                wall_s))
            for node, d in sorted(rows.items())}


def _offsets(segs: list[tuple[float, float, str]], t: np.ndarray) -> np.ndarray:
    """``_offset`` of every element of ``t`` at once (same floating-point operations, same results)."""
    out = np.zeros(len(t))
    if not segs or not len(t):
        return out
    last = segs[-1][:2]
    todo = np.ones(len(t), dtype=bool)
    before = 0.0
    for start, end, _ in segs:
        hit = todo & ((t <= end) | ((start, end) == last))
        out[hit] = before + np.maximum(0.0, np.minimum(t[hit], end) - start)
        todo &= ~hit
        before += end - start
    out[todo] = before
    return out


def _offset(segs: list[tuple[float, float, str]], t: float) -> float:
    """Position of wall time ``t`` on the run's timeline of concatenated segments."""
    before = 0.0
    for start, end, _ in segs:
        if t <= end or (start, end) == segs[-1][:2]:
            return before + max(0.0, min(t, end) - start)
        before += end - start
    return before
