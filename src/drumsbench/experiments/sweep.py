"""``drumsbench sweep``: confirmed windows at rising concurrency, N_max, a soak at N_max, bursts.

One ledger run of kind ``sweep``. For each N of ``--concurrency`` (increasing) one window of
``--window`` runs (a segment labelled ``N<n>``), with its own isolation positive control. Each
window is judged (``measure.windows.judge``). Climbing stops at the first window that is not
confirmed or whose throughput did not improve on the previous window's by more than ``min_gain``.
N_max is the largest N with a confirmed window. A soak (``soak-N<n>``) at N_max follows, judged the
same way; then, with ``--burst``, a short burst (``burst-N<n>``) that is reported as a burst and
never counted as steady state.

Beside every window, the leak sampler (``experiments.leak_sampler``) records what the harness
holds — fds, processes and zombies under it, mounts, /tmp and /dev/shm entries, the sandbox store's
disk use, dockerd's or conmon's memory — as a ``leaks`` artifact; each window's leak check (the slope
per hour of each, with its interval: ``measure.leaks``) is one of its confirmation checks when judged.

The steady-state figure — valid rollouts per host-hour, bootstrap interval — pools the confirmed
windows at N_max (its step window and the soak, when it held). The report is rebuilt from the
ledger alone (``build``): verdicts, the climb and its stop are recomputed from the windows.

On Ray (``base.executor == "ray"``) the sweep keeps one connection for all its windows; N is per
node (a window runs nodes x N attempts at once). Around every window it records the cluster's
nodes at its start and end and when the nodes were ready (a ``cluster`` artifact: host-hours count
every host in the cluster, busy or idle; a node lost mid-window fails the window's ``nodes``
check). With two nodes or more, each step window ``N<n>`` is followed by a **node-alone** window
``node-N<n>`` on one node at the same N: N_max per node is the largest N whose node-alone window is
confirmed, N_max for the cluster the largest N whose cluster window is, and the **coordination
tax** at each N is ``1 - cluster rate / (nodes x node-alone rate)``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from drumsbench.core.errors import UsageError
from drumsbench.experiments.leak_sampler import LeakSampler
from drumsbench.experiments.run import RunConfig, execute
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.cluster import NODE_ALONE, ClusterSweepReport, cluster_summary
from drumsbench.measure.cost import (
    DEFAULT_PRICE,
    AttributionInputs,
    HostFigure,
    HostPrice,
    PriceFile,
    attribute,
    host_figures,
    pool_use,
)
from drumsbench.measure.reports import NotRun, SteadyState, SweepReport
from drumsbench.measure.windows import (
    ClusterArtifact,
    ClusterNode,
    Criteria,
    WindowVerdict,
    cluster_info,
    hosts_of,
    judge,
    leak_samples,
    nodes_used,
    pooled_rate,
    usage,
    window_info,
)


class SweepConfig(BaseModel):
    base: RunConfig
    concurrency: list[int] = Field(min_length=1)
    window_s: float = Field(900.0, gt=0)
    soak_s: float | None = Field(3600.0, gt=0)
    burst_s: float | None = Field(None, gt=0)
    burst_concurrency: int | None = Field(None, ge=1, le=512)
    invalid_threshold: float = Field(0.01, ge=0, lt=1)
    stability: float = Field(0.25, gt=0, le=1)
    min_gain: float = Field(0.05, ge=0, le=10)
    inject_at: list[int] | None = None
    prices: list[PriceFile] = Field(default_factory=list)

    @field_validator("concurrency")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        for n in v:
            if not 1 <= n <= 512:
                raise ValueError(f"{n} is out of range; give values from 1 to 512")
        if any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError("must be strictly increasing, e.g. 1,2,4,8")
        return v

    @model_validator(mode="after")
    def _inject_at_known(self) -> SweepConfig:
        if self.inject_at is not None:
            unknown = [n for n in self.inject_at if n not in self.concurrency]
            if unknown:
                raise UsageError(f"--inject-at: {unknown[0]} is not one of --concurrency "
                                 f"{','.join(map(str, self.concurrency))}")
            if not self.base.inject:
                raise UsageError("--inject-at: give --inject too (which faults, at what rate)")
        return self

    @property
    def criteria(self) -> Criteria:
        return Criteria(invalid_threshold=self.invalid_threshold, stability=self.stability)

    def window_cfg(self, label: str, n: int, seconds: float) -> RunConfig:
        inject = self.base.inject
        if self.inject_at is not None and (not label.startswith("N") or n not in self.inject_at):
            inject = ""
        return self.base.model_copy(update={"window": label, "concurrency": n, "duration_s": seconds,
                                            "max_attempts": None, "inject": inject})


@contextlib.contextmanager
def _ray(cfg: SweepConfig) -> Iterator[tuple[Any, Any] | None]:
    """On Ray: one connection for every window and a ``Session`` to learn what each window's nodes did."""
    if cfg.base.executor != "ray":
        yield None
        return
    from drumsbench.executors import ray as ray_exec

    ray, disconnect = ray_exec.connect(cfg.base.ray_address)
    try:
        with ray_exec.session(ray_exec.Session()) as sess:
            yield ray, sess
    finally:
        disconnect()


def _cluster_artifact(before: list[tuple[str, str, bool]], after: list[tuple[str, str, bool]],
                      used: int | None, ready: float | None) -> ClusterArtifact:
    host = {i: h for i, h, _ in (*before, *after)}
    start = {i for i, _, alive in before if alive}
    end = {i for i, _, alive in after if alive}
    nodes = [ClusterNode(node_id=i, host=host[i], at_start=i in start, at_end=i in end)
             for i in sorted(start | end)]
    return ClusterArtifact(nodes=nodes, used=used, work_started=ready)


def run_sweep(ledger: Ledger, run_id: str, cfg: SweepConfig,
              on_window: Callable[[WindowVerdict], None] | None = None,
              on_start: Callable[[str, int, float], None] | None = None) -> str:
    """Run the sweep's windows; returns the run's final status (``complete`` or ``interrupted``)."""
    with _ray(cfg) as ray_ctx:
        return _run_sweep(ledger, run_id, cfg, ray_ctx, on_window, on_start)


def _run_sweep(ledger: Ledger, run_id: str, cfg: SweepConfig, ray_ctx: tuple[Any, Any] | None,
               on_window: Callable[[WindowVerdict], None] | None,
               on_start: Callable[[str, int, float], None] | None) -> str:
    crit = cfg.criteria

    def window(label: str, n: int, seconds: float, node_limit: int | None = None) -> tuple[str, WindowVerdict]:
        if on_start:
            on_start(label, n, seconds)
        before: list[tuple[str, str, bool]] = []
        if ray_ctx is not None:
            from drumsbench.executors.ray import cluster_nodes

            ray, sess = ray_ctx
            sess.node_limit = node_limit
            before, ready_n = cluster_nodes(ray), len(sess.ready_at)
        sampler = LeakSampler(cfg.base.substrate, seconds, run_id=run_id).start()
        try:
            status, _ = execute(ledger, run_id, cfg.window_cfg(label, n, seconds), resume=False)
        finally:
            artifacts.put(ledger, run_id, label, sampler.stop())
            if ray_ctx is not None:
                ready = sess.ready_at[ready_n] if len(sess.ready_at) > ready_n else None
                artifacts.put(ledger, run_id, label, _cluster_artifact(before, cluster_nodes(ray), node_limit, ready))
        verdict = judge(ledger, run_id, label, crit)
        if on_window:
            on_window(verdict)
        return status, verdict

    status = "complete"
    steps: list[WindowVerdict] = []
    for n in cfg.concurrency:
        status, v = window(f"N{n}", n, cfg.window_s)
        steps.append(v)
        if status != "interrupted" and ray_ctx is not None and len(v.nodes) >= 2:
            status, _ = window(f"{NODE_ALONE}N{n}", n, cfg.window_s, node_limit=1)
        if status == "interrupted" or climb_stop(steps, cfg.min_gain) is not None:
            break
    n_max = max((v.concurrency for v in steps if v.confirmed), default=None)
    if status != "interrupted" and n_max is not None and cfg.soak_s:
        status, _ = window(f"soak-N{n_max}", n_max, cfg.soak_s)
    if status != "interrupted" and cfg.burst_s:
        n = cfg.burst_concurrency or max(cfg.concurrency)
        status, _ = window(f"burst-N{n}", n, cfg.burst_s)
    ledger.set_status(run_id, status)
    return status


def climb_stop(steps: list[WindowVerdict], min_gain: float) -> str | None:
    """Why climbing stops after the last of ``steps`` (None: keep climbing)."""
    last = steps[-1]
    if not last.confirmed:
        return f"N={last.concurrency} not confirmed"
    earlier = [v for v in steps[:-1] if v.confirmed]
    if earlier:
        prev = earlier[-1]
        a, b = prev.valid_per_host_hour.value or 0.0, last.valid_per_host_hour.value or 0.0
        if b <= a * (1 + min_gain):
            return (f"throughput stopped improving: N={last.concurrency} gave {b:.4g} valid/host-h vs "
                    f"{a:.4g} at N={prev.concurrency} (needs > +{min_gain:.0%})")
    return None


# -- the report: its models live in measure/reports.py (renderers read them there) -------------------


def build(ledger: Ledger, run_id: str, prices: list[PriceFile] | None = None) -> SweepReport:
    run = ledger.run(run_id)
    if run["kind"] != "sweep":
        raise UsageError(f"run {run_id} is a {run['kind']!r} run, not a sweep")
    cfg = SweepConfig.model_validate(run["config"])
    crit = cfg.criteria
    infos = window_info(ledger, run_id)
    rows_all = ledger.attempts(run_id, ("window", "outcome", "cause", "injected", "t_start", "t_end",
                                        "provision_s", "reset_s", "steps_s", "verify_s", "teardown_s",
                                        "concurrency"))
    labels = list(dict.fromkeys(lab for _, _, lab in ledger.segments(run_id)))
    samples = leak_samples(ledger, run_id)
    clusters = cluster_info(ledger, run_id)
    windows = [judge(ledger, run_id, lab, crit, rows=[r for r in rows_all if r[0] == lab], info=infos.get(lab, {}),
                     samples=samples, clusters=clusters) for lab in labels]
    steps = [v for v in windows if v.kind == "step"]

    stopped: str | None = None
    for i in range(len(steps)):
        stopped = climb_stop(steps[: i + 1], cfg.min_gain)
        if stopped:
            steps = steps[: i + 1]
            break
    ran = {v.concurrency for v in steps}
    last_ran = steps[-1].concurrency if steps else None
    not_run = []
    for n in cfg.concurrency:
        if n in ran:
            continue
        if stopped:
            why = f"climb stopped at N={last_ran}: {stopped}"
        elif run["status"] != "complete":
            why = f"the sweep ended early ({run['status']})"
        else:
            why = "not run"
        not_run.append(NotRun(concurrency=n, reason=why))

    confirmed = [v for v in steps if v.confirmed]
    n_max = max((v.concurrency for v in confirmed), default=None)
    if n_max is None:
        n_max_reason = "no window was confirmed" if steps else "no window ran"
    else:
        n_max_reason = f"largest N with a confirmed window: N={n_max}"
        if not stopped and n_max == max(cfg.concurrency):
            n_max_reason += " (the largest N asked for: the host may take more; add higher levels)"
    soak = next((v for v in windows if v.kind == "soak"), None)
    soak_held = bool(soak and soak.confirmed and n_max is not None and soak.concurrency == n_max)
    bursts = [v for v in windows if v.kind == "burst"]

    counted = [v for v in windows if v.confirmed and n_max is not None and v.concurrency == n_max
               and v.kind in ("step", "soak")]
    for v in counted:
        v.counted = True
    rate = pooled_rate(ledger, run_id, [v.label for v in counted])
    if n_max is None:
        note = "no confirmed window: no steady-state throughput is claimed"
    elif not cfg.soak_s:
        note = f"N_max={n_max} from its window; no soak was asked for, so N_max is not held"
    elif soak is None:
        note = f"N_max={n_max}; the soak did not run"
    elif soak_held:
        note = f"N_max={n_max} held through a {soak.planned_s or 0:g} s soak"
    else:
        note = f"N_max={n_max} did NOT hold through the soak: {'; '.join(soak.reasons)}"
    steady = SteadyState(concurrency=n_max, windows=[v.label for v in counted], valid=rate.n,
                         hours=sum(v.measured_s for v in counted) / 3600, valid_per_host_hour=rate,
                         held=soak_held, note=note)

    if prices is None:
        prices = cfg.prices
    priced: list[tuple[HostPrice, AttributionInputs]] = [(h, p.attribution) for p in prices for h in p.hosts()]
    if not priced:
        priced = [(cfg.base.price or DEFAULT_PRICE, AttributionInputs())]
    hosts = [h for h, _ in priced]
    host_s = sum(max(0.0, e - s) * hosts_of(clusters.get(lab)) for s, e, lab in ledger.segments(run_id))
    # no confirmed window: no steady-state throughput, so no USD per valid rollout at all (withheld)
    figures = host_figures(hosts, rate, host_s / 3600) if n_max is not None else []
    attribution = []
    if counted:
        use = usage(ledger, run_id, [v.label for v in counted])
        pool = pool_use(ledger, run_id, [v.label for v in counted])  # what the warm pool really held
        for h, inputs in priced:
            attribution.append(attribute(h, inputs, use, scope=f"confirmed windows at N_max={n_max}: "
                                         + ", ".join(v.label for v in counted), pool=pool))
    leaks_passed, leaks_note = leak_summary(windows)
    machine = run["machine"]
    b = cfg.base
    conditions = (f"{b.substrate} substrate, tasks {b.tasks}, policy {b.policy}, on {machine.get('cores', '?')} cores "
                  f"({machine.get('cpu_model', '?')}), {machine.get('os', '?')}, commit {run['commit']}; 95% intervals")
    extra: dict[str, Any] = {}
    report_cls: type[SweepReport] = SweepReport
    if cfg.base.executor == "ray":
        report_cls = ClusterSweepReport
        extra["cluster"] = cluster_summary(windows, steps, n_max)
        nodes = max((nodes_used(c) for c in clusters.values()), default=1)
        conditions = conditions.replace("; 95% intervals", f"; Ray, {nodes} node(s), N per node; 95% intervals")
    return report_cls(
        run_id=run_id, kind=run["kind"], status=run["status"], machine=machine, commit=run["commit"],
        config=run["config"],
        criteria={"invalid_threshold": cfg.invalid_threshold, "stability": cfg.stability,
                  "min_gain": cfg.min_gain, "window_s": cfg.window_s, "soak_s": cfg.soak_s,
                  "burst_s": cfg.burst_s},
        host_seconds=host_s, windows=windows, not_run=not_run, climb_stopped=stopped, n_max=n_max,
        n_max_reason=n_max_reason, soak=soak, soak_held=soak_held, steady_state=steady, bursts=bursts,
        prices=figures, attribution=attribution, conditions=conditions, leaks_passed=leaks_passed,
        leaks_note=leaks_note, **extra,
    )


def leak_summary(windows: list[WindowVerdict]) -> tuple[bool | None, str]:
    """The sweep's leak verdict and one line saying so: from the soaks' leak checks, the ones that
    count (a step window's minutes are mostly warm-up: its check is shown, not counted; on docker
    dockerd's memory grows for its first minutes after a start); from every judged window when the
    sweep ran no soak. Step windows whose check failed are named as not counted."""
    judged = [v for v in windows if v.leaks is not None and v.leaks.passed is not None]
    soaks = [v for v in judged if v.kind == "soak"]
    counted = soaks or judged

    def named(vs: list[WindowVerdict]) -> str:
        return "; ".join(f"{v.label} ({', '.join(s.key for s in v.leaks.leaking)})" for v in vs if v.leaks is not None)

    failed = [v for v in counted if v.leaks is not None and not v.leaks.passed]
    warmup = [v for v in judged if v not in counted and v.leaks is not None and not v.leaks.passed]
    aside = f"; failed in step windows (warm-up, not counted): {named(warmup)}" if warmup else ""
    if failed:
        return False, "leak check FAILED in " + named(failed) + aside
    if not judged:
        return None, "leak check: no window had enough samples to judge" if windows else "no window ran"
    which = "every soak" if soaks else "every judged window"
    return True, f"leak check passed in {which} ({len(counted)} of {len(windows)} windows counted)" + aside


def publish(ledger: Ledger, run_id: str, r: SweepReport) -> None:
    """Write the judged sweep as the artifacts the HTML report reads (docs/html-report.md).

    ``window`` (one per window: role, verdict, reasons, rate, flat resources), ``sweep``/``summary``
    and ``price`` (one per priced host). Derived from the ledger; rewritten by every rebuild.
    """
    roles: dict[str, Literal["window", "soak", "burst", "other"]] = {
        "step": "window", "soak": "soak", "burst": "burst", "window": "other"}
    for v in r.windows:
        res = v.resources
        artifacts.put(ledger, run_id, v.label, artifacts.WindowArtifact(
            concurrency=v.concurrency, role=roles[v.kind], planned_s=v.planned_s, ran_s=v.ran_s,
            attempts=v.attempts, valid=v.valid, invalid=v.invalid, invalid_rate=v.invalid_rate,
            valid_per_host_hour=v.valid_per_host_hour, confirmed=v.confirmed, counted=v.counted,
            reasons=[("ok: " if c.passed else "FAIL: ") + c.detail for c in v.checks], leaks=v.leaks,
            resources=artifacts.WindowResources(cpu_busy=(res.get("cpu_busy") or {}).get("mean"),
                                                mem_gib=(res.get("memory_used_gib") or {}).get("mean"),
                                                sandboxes=(res.get("live_sandboxes") or {}).get("max"))))
    artifacts.put(ledger, run_id, "summary", artifacts.SweepSummaryArtifact(
        n_max=r.n_max, soak=r.soak.label if r.soak else None,
        invalid_threshold=r.criteria["invalid_threshold"],
        valid_per_host_hour=r.steady_state.valid_per_host_hour if r.n_max is not None else None,
        stopped=r.climb_stopped, soak_held=r.soak_held, note=r.steady_state.note, leaks_passed=r.leaks_passed,
        leaks_note=r.leaks_note))
    publish_prices(ledger, run_id, r.prices, basis=r.steady_state.note)


def publish_prices(ledger: Ledger, run_id: str, figures: list[HostFigure], basis: str) -> None:
    """One ``price`` artifact per priced host; ``basis`` says what the throughput was measured over."""
    for f in figures:
        billed = f.usd_per_host_hour * f.billed_hours / f.run_hours if f.run_hours > 0 else f.usd_per_host_hour
        artifacts.put(ledger, run_id, f.name, artifacts.PriceArtifact(
            name=f.name, kind=f.kind, usd_per_host_hour=f.usd_per_host_hour,
            billed_usd_per_host_hour=billed if f.billed_hours > f.run_hours else None,
            usd_per_valid_rollout=f.usd_per_valid_rollout, basis=basis, note=f.derivation,
            inputs={"minimum_billed_hours": f.minimum_billed_hours, "run_hours": f.run_hours,
                    "billed_hours": f.billed_hours}))
