"""Windows: the only place a throughput figure may come from.

A **window** is one segment of a run at a fixed concurrency N, labelled in the ledger (the
segment's label, each attempt's ``window``, the positive control's ``window`` and a ``segment``
artifact written by ``experiments.run.execute``). A window is **confirmed** when all its checks
pass:

1. ``full_length`` — it ran its planned length and was not interrupted;
2. ``invalid_rate`` — at least one attempt finished and invalid / attempts <= the threshold;
3. ``isolation_control`` — the isolation positive control ran in the window and fired;
4. ``stable`` — the valid-rollout rates of its two halves differ by at most the tolerance
   (relative to the larger half);
5. ``leaks`` (a soak only) — when the soak's leak samples can be judged (``measure.leaks``: enough
   independent samples after the ramp-up), no quantity's slope per hour is clearly above its
   tolerance. A step or burst window carries its leak verdict without this check.
6. ``nodes`` — on a Ray cluster (the window has a ``cluster`` artifact): every node that was alive
   when the window started was alive when it ended and lost none of its attempts (no attempt of it
   recorded ``lost_node``).

On a cluster the window's **host-hours** are every host (distinct hostname) with a node in the
cluster at the window's start or end, busy or idle, times the measured length: an idle node's
host costs. Two Ray nodes on one machine are one host. Each node's own line (attempts, valid
rollouts per node-hour) is in ``nodes``.

Throughput of a window = valid rollouts that finished inside ``[work start, work start + planned
length]`` divided by that length (attempts finishing in the drain after the deadline count toward
the invalid rate and the cost, not toward the rate). Its interval is a bootstrap over time bins
(``stats.rate_per_hour``).

``ResourceSampler`` records the host beside each window: CPU busy (from ``/proc/stat``), memory
in use (``/proc/meminfo``: MemTotal - MemAvailable) and live sandboxes.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from drumsbench.core.outcome import InvalidCause
from drumsbench.ledger import Ledger
from drumsbench.measure import leaks
from drumsbench.measure.artifacts import Artifact, ClusterArtifact, ClusterNode  # noqa: F401 (re-exported)
from drumsbench.measure.leaks import LeakVerdict
from drumsbench.measure.stats import Estimate, rate_per_hour, scale, wilson

if TYPE_CHECKING:
    from drumsbench.measure.artifacts import LeakSamplesArtifact

WindowKind = Literal["step", "soak", "burst", "window"]
FULL_LENGTH_SLACK = 0.995  # clocks: a window that ran 99.5 % of its length ran its full length


# -- host resources -----------------------------------------------------------------------------

def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
    except (OSError, IndexError):
        return 0, 0
    vals = [int(x) for x in fields]
    idle = vals[3] + vals[4]  # idle + iowait
    total = sum(vals)
    return total - idle, total


def _memory_gib() -> tuple[float | None, float | None]:
    """(used, total) GiB from /proc/meminfo."""
    info: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                info[key] = int(rest.split()[0])
    except (OSError, ValueError):
        return None, None
    if "MemTotal" not in info or "MemAvailable" not in info:
        return None, None
    gib = 1024 * 1024
    return (info["MemTotal"] - info["MemAvailable"]) / gib, info["MemTotal"] / gib


class ResourceSampler:
    """Samples CPU busy, memory in use and live sandboxes in a background thread.

    ``stop()`` returns a summary (means, maxima and the series) that is stored beside the window.
    The sampling interval is a 40th of the planned length, between 0.2 s and 5 s.
    """

    def __init__(self, live_sandboxes: Callable[[], int], planned_s: float | None = None,
                 interval_s: float | None = None) -> None:
        self.live_sandboxes = live_sandboxes
        self.interval_s = interval_s or min(5.0, max(0.2, (planned_s or 40.0) / 40))
        self.series: list[list[float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drumsbench-resources", daemon=True)
        self._t0 = 0.0
        self._last = (0, 0)

    def start(self) -> ResourceSampler:
        self._t0 = time.monotonic()
        self._last = _cpu_times()
        self._thread.start()
        return self

    def _sample(self) -> None:
        busy, total = _cpu_times()
        d_busy, d_total = busy - self._last[0], total - self._last[1]
        self._last = (busy, total)
        cpu = d_busy / d_total if d_total > 0 else None
        used, _ = _memory_gib()
        try:
            live = int(self.live_sandboxes())
        except Exception:  # a sampler must never break a window
            live = None
        self.series.append([round(time.monotonic() - self._t0, 3), cpu, used, live])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        _, total_gib = _memory_gib()

        def col(i: int) -> list[float]:
            return [float(v) for v in (s[i] for s in self.series) if v is not None]

        def stat(values: list[float]) -> dict[str, float | None]:
            return {"mean": sum(values) / len(values) if values else None, "max": max(values) if values else None}

        import os

        return {
            "interval_s": self.interval_s,
            "samples": len(self.series),
            "cores": os.cpu_count() or 1,
            "cpu_busy": stat(col(1)),  # fraction of all cores, 0..1
            "memory_used_gib": stat(col(2)),
            "memory_total_gib": total_gib,
            "live_sandboxes": stat(col(3)),
            "series": {"columns": ["t_s", "cpu_busy", "memory_used_gib", "live_sandboxes"], "rows": self.series},
        }


# -- judging a window ---------------------------------------------------------------------------

class Criteria(BaseModel, frozen=True):
    """What a window must meet to be confirmed."""

    invalid_threshold: float = Field(0.01, ge=0, lt=1)
    stability: float = Field(0.25, gt=0, le=1)


class Check(BaseModel):
    name: str
    passed: bool
    detail: str


class NodeLine(BaseModel):
    """One node's share of a window."""

    node_id: str
    host: str
    attempts: int
    valid: int
    invalid: int
    lost_attempts: int  # in flight when the node was lost (recorded invalid/substrate_failure)
    finished: bool  # alive at the end and lost none of its attempts
    valid_per_node_hour: Estimate


class WindowVerdict(BaseModel):
    label: str
    kind: WindowKind
    concurrency: int
    planned_s: float | None
    ran_s: float
    measured_s: float
    interrupted: bool
    attempts: int
    valid: int
    success: int
    failed: int
    invalid: int
    invalid_by_cause: dict[str, int]
    injected: int
    invalid_rate: Estimate
    valid_per_host_hour: Estimate
    halves_per_host_hour: list[float]
    halves_differ: float | None
    control_fired: bool | None
    confirmed: bool
    checks: list[Check]
    resources: dict[str, Any] = Field(default_factory=dict)
    counted: bool = False  # in the steady-state figure (set by the sweep report)
    leaks: LeakVerdict | None = None  # the leak check (measure/leaks.py); when judged, also the check "leaks"
    # on a Ray cluster: hosts paid for (busy or idle), the nodes that ran it and each node's line
    host_count: int = 1
    nodes: list[NodeLine] = Field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        return [c.detail for c in self.checks if not c.passed]

    def verdict_line(self) -> str:
        if self.confirmed:
            return "confirmed: " + "; ".join(c.detail for c in self.checks)
        return "NOT confirmed: " + "; ".join(self.reasons)


def kind_of(label: str) -> WindowKind:
    if label.startswith("soak"):
        return "soak"
    if label.startswith("burst"):
        return "burst"
    return "step" if label.startswith("N") else "window"


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "?"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def window_info(ledger: Ledger, run_id: str) -> dict[str, dict[str, Any]]:
    """The ``segment`` artifacts of a run (what ``execute`` recorded about each labelled segment), by label."""
    from drumsbench.measure.artifacts import SegmentArtifact, load

    return {label: seg.model_dump(mode="json") for label, seg in load(ledger, run_id, SegmentArtifact).items()}


WINDOW_COLUMNS = ("window", "outcome", "cause", "injected", "t_start", "t_end", "provision_s", "reset_s",
                  "steps_s", "verify_s", "teardown_s", "concurrency")


def leak_samples(ledger: Ledger, run_id: str) -> dict[str, LeakSamplesArtifact]:
    """The ``leaks`` artifacts of a run (what the leak sampler recorded beside each window), by label."""
    from drumsbench.measure.artifacts import LeakSamplesArtifact, load

    return load(ledger, run_id, LeakSamplesArtifact)


def cluster_info(ledger: Ledger, run_id: str) -> dict[str, ClusterArtifact]:
    """The ``cluster`` artifacts of a run (the Ray cluster around each window), by label; empty in process."""
    from drumsbench.measure.artifacts import load

    return load(ledger, run_id, ClusterArtifact)


def hosts_of(cluster: ClusterArtifact | None) -> int:
    """Hosts paid for during a window: distinct hostnames with a node there at its start or end (1 in process)."""
    if cluster is None:
        return 1
    return max(1, len({n.host for n in cluster.nodes if n.at_start or n.at_end}))


def nodes_used(cluster: ClusterArtifact | None) -> int:
    """Nodes that ran the window's attempts (1 in process)."""
    if cluster is None:
        return 1
    alive = sum(n.at_start for n in cluster.nodes)
    return max(1, min(alive, cluster.used) if cluster.used is not None else alive)


def node_lines(ledger: Ledger, run_id: str, label: str, cluster: ClusterArtifact, started: float,
               measured: float) -> list[NodeLine]:
    """Each node's share of window ``label``: every node alive at its start (busy or idle), and any
    other node that recorded attempts in it."""
    per: dict[str, list[tuple[bool, str, float]]] = {}
    for node, lost, outcome, t_end in ledger.db.execute(
            "SELECT COALESCE(json_extract(extra, '$.node'), ''), COALESCE(json_extract(extra, '$.lost_node'), 0), "
            "outcome, t_end FROM attempts WHERE run_id = ? AND window = ?", (run_id, label)):
        per.setdefault(node, []).append((bool(lost), outcome, t_end))
    known = {n.node_id: n for n in cluster.nodes}
    order = [n.node_id for n in cluster.nodes if n.at_start] + sorted(set(per) - {n.node_id for n in cluster.nodes
                                                                               if n.at_start})
    lines = []
    for node_id in order:
        rows = per.get(node_id, [])
        meta = known.get(node_id)
        lost = sum(1 for lo, _, _ in rows if lo)
        valid = [t - started for _, o, t in rows if o != "invalid"]
        lines.append(NodeLine(
            node_id=node_id, host=meta.host if meta else "?", attempts=len(rows), valid=len(valid),
            invalid=len(rows) - len(valid), lost_attempts=lost,
            finished=bool(meta and meta.at_start and meta.at_end) and lost == 0,
            valid_per_node_hour=rate_per_hour([o for o in valid if 0 <= o <= measured], measured)))
    return lines


def judge(ledger: Ledger, run_id: str, label: str, criteria: Criteria,
          rows: Sequence[tuple[Any, ...]] | None = None, info: dict[str, Any] | None = None,
          samples: dict[str, LeakSamplesArtifact] | None = None,
          clusters: dict[str, ClusterArtifact] | None = None) -> WindowVerdict:
    """The verdict of window ``label`` of ``run_id``, from the ledger alone (``samples``, ``clusters``:
    the run's leak samples and cluster artifacts, when the caller has them already)."""
    if info is None:
        info = window_info(ledger, run_id).get(label, {})
    if rows is None:
        rows = [r for r in ledger.attempts(run_id, WINDOW_COLUMNS) if r[0] == label]
    cluster = (cluster_info(ledger, run_id) if clusters is None else clusters).get(label)
    seg = [(s, e) for s, e, lab in ledger.segments(run_id) if lab == label]
    ran_s = sum(e - s for s, e in seg)
    started = info.get("work_started", seg[0][0] if seg else 0.0)
    if cluster is not None and cluster.work_started is not None:
        started = cluster.work_started  # the nodes were ready then: their set-up is not work
    ended = info.get("ended", seg[-1][1] if seg else 0.0)
    planned = info.get("planned_s")
    interrupted = bool(info.get("interrupted", False))
    worked = max(0.0, ended - started)
    measured = min(planned, worked) if planned else worked
    concurrency = int(info.get("concurrency") or (rows[0][-1] if rows else 0))

    causes = {c.value: 0 for c in InvalidCause}
    valid_offsets: list[float] = []
    success = failed = injected = 0
    for _, outcome, cause, inj, _t0, t_end, *_ in rows:
        if inj:
            injected += 1
        if outcome == "invalid":
            causes[cause] += 1
            continue
        if outcome == "success":
            success += 1
        else:
            failed += 1
        off = t_end - started
        if 0 <= off <= measured:
            valid_offsets.append(off)
    n = len(rows)
    valid = success + failed
    invalid = n - valid
    hosts = hosts_of(cluster)
    throughput = rate_per_hour(valid_offsets, measured)
    if hosts > 1:
        throughput = scale(throughput, 1 / hosts)  # per host-hour, idle hosts included
    half = measured / 2
    halves = [0.0, 0.0]
    counts = (0, 0)
    if measured > 0:
        first = sum(1 for o in valid_offsets if o < half)
        counts = (first, len(valid_offsets) - first)
        halves = [counts[0] / half * 3600 / hosts, counts[1] / half * 3600 / hosts]
    top = max(halves)
    differ = abs(halves[0] - halves[1]) / top if top > 0 else None
    controls = [c for c in ledger.controls(run_id) if c["window"] == label and c["kind"] == "isolation"]
    control_fired = None if not controls else all(c["fired"] for c in controls)

    checks = []
    if planned:
        full = not interrupted and worked >= planned * FULL_LENGTH_SLACK
        why = "interrupted" if interrupted else f"ran {_fmt_s(worked)} of {_fmt_s(planned)}"
        checks.append(Check(name="full_length", passed=full,
                            detail=(f"ran its full length ({_fmt_s(planned)})" if full else f"short: {why}")))
    else:
        checks.append(Check(name="full_length", passed=False, detail="no planned length recorded"))
    rate = invalid / n if n else None
    if rate is None:
        checks.append(Check(name="invalid_rate", passed=False, detail="no attempt finished"))
    else:
        ok = rate <= criteria.invalid_threshold + 1e-12
        top_causes = ", ".join(f"{c} {k}" for c, k in sorted(causes.items(), key=lambda x: -x[1]) if k)
        detail = (f"invalid {invalid}/{n} = {rate:.1%} {'<=' if ok else '>'} threshold "
                  f"{criteria.invalid_threshold:.1%}" + (f" ({top_causes})" if top_causes else ""))
        checks.append(Check(name="invalid_rate", passed=ok, detail=detail))
    if control_fired is None:
        checks.append(Check(name="isolation_control", passed=False, detail="isolation positive control not run"))
    else:
        checks.append(Check(name="isolation_control", passed=control_fired,
                            detail="isolation positive control fired" if control_fired
                            else "isolation positive control DID NOT FIRE"))
    if differ is None:
        checks.append(Check(name="stable", passed=False, detail="no valid rollout finished inside the window"))
    else:
        ok = differ <= criteria.stability + 1e-12
        noise = 2 * math.sqrt(sum(counts)) / max(counts)  # ~95% counting noise of the difference alone
        checks.append(Check(name="stable", passed=ok, detail=(
            f"halves {halves[0]:.4g} and {halves[1]:.4g} valid/host-h ({counts[0]} and {counts[1]} rollouts) "
            f"differ {differ:.0%} ({'<=' if ok else '>'} tolerance {criteria.stability:.0%}; counting noise "
            f"alone ~{noise:.0%})")))

    lines: list[NodeLine] = []
    if cluster is not None:
        lines = node_lines(ledger, run_id, label, cluster, started, measured)
        gone = [ln for ln in lines if not ln.finished and any(n.node_id == ln.node_id and n.at_start
                                                              for n in cluster.nodes)]
        gone += [ln for ln in lines if ln.lost_attempts and ln not in gone]
        if gone:
            checks.append(Check(name="nodes", passed=False, detail="; ".join(
                f"node {ln.node_id[:8]} on {ln.host} lost mid-window ({ln.lost_attempts} in-flight attempt(s) "
                "recorded invalid)" for ln in gone)))
        else:
            started_n = sum(n.at_start for n in cluster.nodes)
            used = "" if cluster.used is None else f", {nodes_used(cluster)} running attempts"
            checks.append(Check(name="nodes", passed=True, detail=(
                f"every node that started the window finished it ({started_n} node(s) on {hosts} host(s){used})")))

    leak = None
    window_samples = (leak_samples(ledger, run_id) if samples is None else samples).get(label)
    if window_samples is not None:
        span_from = leaks.ramp_end(started, planned, [r[5] for r in rows], concurrency)
        leak = leaks.judge(window_samples, started, span_to=started + measured, span_from=span_from)
        if leak.passed is not None and kind_of(label) == "soak":
            # the soak's verdict (docs/metric.md): a step window's minutes are dominated by warm-up (a
            # daemon's first growth, caches), so there the check is shown, not counted; a window too
            # short to judge is not failed for it
            checks.append(Check(name="leaks", passed=leak.passed, detail=(
                "leak check: " + leak.detail if leak.passed else leak.detail)))

    return WindowVerdict(
        label=label, kind=kind_of(label), concurrency=concurrency, planned_s=planned, ran_s=ran_s,
        measured_s=measured, interrupted=interrupted, attempts=n, valid=valid, success=success, failed=failed,
        invalid=invalid, invalid_by_cause=causes, injected=injected, invalid_rate=wilson(invalid, n),
        valid_per_host_hour=throughput, halves_per_host_hour=halves, halves_differ=differ,
        control_fired=control_fired, confirmed=all(c.passed for c in checks), checks=checks,
        resources={k: v for k, v in info.get("resources", {}).items() if k != "series"}, leaks=leak,
        host_count=hosts, nodes=lines,
    )


def pooled_rate(ledger: Ledger, run_id: str, labels: Sequence[str]) -> Estimate:
    """Valid rollouts per host-hour over several windows laid end to end (their measured spans)."""
    infos = window_info(ledger, run_id)
    clusters = cluster_info(ledger, run_id)
    rows = ledger.attempts(run_id, ("window", "outcome", "t_end"))
    offsets: list[float] = []
    span = 0.0
    for label in labels:
        info = infos.get(label, {})
        started, planned = info.get("work_started"), info.get("planned_s")
        cluster = clusters.get(label)
        if cluster is not None and cluster.work_started is not None:
            started = cluster.work_started
        if started is None or not planned:
            continue
        measured = min(planned, max(0.0, info.get("ended", started) - started))
        hosts = hosts_of(cluster)  # a window on h hosts is h host-lengths of the span
        offsets += [span + (t - started) * hosts for w, o, t in rows
                    if w == label and o != "invalid" and 0 <= t - started <= measured]
        span += measured * hosts
    return rate_per_hour(offsets, span)


# -- usage, for cost attribution ------------------------------------------------------------------

class Usage(BaseModel):
    """What a set of windows (or a whole run) used, measured from the ledger's phase timings."""

    host_seconds: float
    slot_seconds: float
    attempts: int
    verified: int  # attempts with a trustworthy verifier result (success or failed)
    verifier_calls: int
    steps: int
    provision_reset_s: float  # provision + reset + teardown, summed over attempts
    steps_s: float
    verify_s: float
    attempt_s: float  # whole attempts (start to end)
    cpu_core_hours: float | None = None
    memory_gib_hours: float | None = None
    # a model behind an endpoint, as the policy recorded it (``extra.inference`` of each attempt)
    inference_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    inference_s: float = 0.0

    @property
    def harness_s(self) -> float:
        """Attempt time outside the timed phases: gates, observations, policy, canary scan."""
        return max(0.0, self.attempt_s - self.provision_reset_s - self.steps_s - self.verify_s)

    @property
    def idle_slot_s(self) -> float:
        """Slot time with no attempt running: controls, drain at the end of a window, hand-over."""
        return max(0.0, self.slot_seconds - self.attempt_s)


def usage(ledger: Ledger, run_id: str, labels: Sequence[str] | None = None) -> Usage:
    """Usage of windows ``labels`` of ``run_id`` (None: the whole run at its configured concurrency)."""
    run = ledger.run(run_id)
    infos = window_info(ledger, run_id)
    segs = ledger.segments(run_id)
    cols = ("window", "outcome", "cause", "provision_s", "reset_s", "steps_s", "verify_s", "teardown_s",
            "t_start", "t_end", "concurrency", "extra")
    rows = ledger.attempts(run_id, cols)
    if labels is not None:
        wanted = set(labels)
        segs = [s for s in segs if s[2] in wanted]
        rows = [r for r in rows if r[0] in wanted]
    clusters = cluster_info(ledger, run_id)
    host_s = sum(max(0.0, e - s) * hosts_of(clusters.get(label)) for s, e, label in segs)
    slot_s = 0.0
    cpu_h = mem_h = 0.0
    have_res = False
    for s, e, label in segs:
        info = infos.get(label) if label else None
        conc = (info or {}).get("concurrency") or run["config"].get("concurrency") or 1
        if labels is None and not label:
            conc = run["config"].get("concurrency") or 1
        slot_s += conc * nodes_used(clusters.get(label)) * max(0.0, e - s)  # on Ray N is per node
        res = (info or {}).get("resources") or {}
        if res.get("cpu_busy", {}).get("mean") is not None:
            have_res = True
            cpu_h += res["cpu_busy"]["mean"] * res.get("cores", 1) * (e - s) / 3600
            if res.get("memory_used_gib", {}).get("mean") is not None:
                mem_h += res["memory_used_gib"]["mean"] * (e - s) / 3600
    verified = sum(1 for r in rows if r[1] != "invalid")
    steps = [json.loads(r[5]) for r in rows]
    inference = [inf for r in rows if isinstance(inf := json.loads(r[11] or "{}").get("inference"), dict)]
    return Usage(
        host_seconds=host_s,
        slot_seconds=slot_s,
        attempts=len(rows),
        verified=verified,
        verifier_calls=sum(1 for r in rows if r[6] > 0),
        steps=sum(len(s) for s in steps),
        provision_reset_s=sum(r[3] + r[4] + r[7] for r in rows),
        steps_s=sum(sum(s) for s in steps),
        verify_s=sum(r[6] for r in rows),
        attempt_s=sum(r[9] - r[8] for r in rows),
        cpu_core_hours=cpu_h if have_res else None,
        memory_gib_hours=mem_h if have_res else None,
        inference_calls=sum(int(i.get("calls") or 0) for i in inference),
        prompt_tokens=sum(int(i.get("prompt_tokens") or 0) for i in inference),
        completion_tokens=sum(int(i.get("completion_tokens") or 0) for i in inference),
        inference_s=sum(float(i.get("latency_s") or 0.0) for i in inference),
    )
