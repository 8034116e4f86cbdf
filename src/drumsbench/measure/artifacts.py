"""Every artifact a command stores in the ledger: one typed model per kind, shared by writer and reader.

The ledger's ``artifacts`` table holds JSON per (run, kind, name). The producers (``experiments/``)
build these models and write them with :func:`put`; the renderers (``report/``) read them back with
:func:`load` or :func:`load_run`, so a field renamed on one side is a type error on the other, never
a "–" on a page. Models forbid unknown fields: an artifact written by another version of the code
fails validation loudly (the HTML report shows the error in the section, the rest of the page is
written).

Kinds (``KIND`` of each model) and their names:

=================  ==================================  ========================================
kind               name                                written by
=================  ==================================  ========================================
``segment``        the window's label                  run (windowed segments of a sweep)
``window``         the window's label                  sweep (judged windows)
``leaks``          the window's label                  sweep (leak samples of each window)
``sweep``          ``summary``                         sweep
``price``          the priced host's name              sweep, run, report (derived figures)
``prices``         ``files``                           run, sweep (price files as given)
``coldstart``      the substrate                       coldstart
``isolation``      the substrate                       isolation
``branch``         the fork method                     branch (one per method)
``branch-summary`` ``report``                          branch
``projection``     the substrate (label)               project
``screenshot``     ``<task>/<seq or method>/<stage>``  run on desktop tasks, branch on desktop
``chaos-event``    ``event-NNNN``                      chaos (one per injected event)
``chaos``          ``summary``                         chaos (its checks)
``cluster``        the window's label                  sweep --executor ray (the nodes around a window)
``pool``           the window's label or the run's     run, sweep (``measure.cost.PoolUse``: what the warm pool held)
``coldstart-pool`` the substrate                       coldstart --pool (``measure.pool.PoolColdstartArtifact``)
``desktop-coldstart`` the substrate                    coldstart --tasks desktop
=================  ==================================  ========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from drumsbench.ledger import Ledger
from drumsbench.measure.cost import POOL_KIND, HostPrice, PriceFile
from drumsbench.measure.leaks import LeakVerdict
from drumsbench.measure.stats import Estimate, median_ratio, quantile, rate_ratio, wilson
from drumsbench.measure.train_report import TrainReport

WHOLE_RUN = "whole run, not a confirmed window"  # the basis of any figure not from a sweep's confirmed windows


class Artifact(BaseModel):
    """Base of every artifact model; ``KIND`` is the ledger's ``kind`` column."""

    KIND: ClassVar[str]
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


A = TypeVar("A", bound=Artifact)


def put(ledger: Ledger, run_id: str, name: str, artifact: Artifact) -> None:
    """Store ``artifact`` under (run, its KIND, name), replacing an earlier one of that name."""
    ledger.put_artifact(run_id, artifact.KIND, name, artifact.model_dump(mode="json", by_alias=True))


def load(ledger: Ledger, run_id: str, model: type[A]) -> dict[str, A]:
    """Every artifact of ``model``'s kind for the run, by name, in the order written.

    Raises pydantic's ``ValidationError`` when a stored artifact does not fit the model."""
    return {name: model.model_validate(data) for name, data in ledger.artifacts(run_id, model.KIND).items()}


# -- shared pieces -----------------------------------------------------------------------------------

class Latency(BaseModel):
    """Percentiles with order-statistics intervals, and the samples they came from (for CDFs)."""

    n: int
    p50: Estimate
    p95: Estimate
    p99: Estimate
    samples_s: list[float] = Field(default_factory=list)


def latency(values: Sequence[float]) -> Latency:
    vals = [float(v) for v in values]
    return Latency(n=len(vals), p50=quantile(vals, 0.5), p95=quantile(vals, 0.95), p99=quantile(vals, 0.99),
                   samples_s=vals)


class Share(BaseModel):
    """``faithful`` of ``total`` continuations kept one dimension; ``estimate`` is the Wilson share."""

    faithful: int = Field(ge=0)
    total: int = Field(ge=0)

    @property
    def value(self) -> float | None:
        """The faithful share (None when no continuation was checked)."""
        return self.faithful / self.total if self.total else None

    @property
    def estimate(self) -> Estimate:
        return wilson(self.faithful, self.total)

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.faithful == self.total


def share(flags: Sequence[bool]) -> Share:
    return Share(faithful=sum(bool(f) for f in flags), total=len(flags))


# -- run and sweep -------------------------------------------------------------------------------------

class SegmentArtifact(Artifact):
    """One windowed segment of a run as it ran (a sweep's window before it is judged)."""

    KIND: ClassVar[str] = "segment"
    concurrency: int
    planned_s: float | None
    max_attempts: int | None
    work_started: float
    ended: float
    interrupted: bool
    config: dict[str, Any]
    resources: dict[str, Any]


class WindowResources(BaseModel):
    cpu_busy: float | None = None
    mem_gib: float | None = None
    sandboxes: float | None = None


class WindowArtifact(Artifact):
    """A judged window of a sweep: its role, whether it is confirmed and why."""

    KIND: ClassVar[str] = "window"
    concurrency: int
    role: Literal["window", "soak", "burst", "other"]
    planned_s: float | None
    ran_s: float
    attempts: int
    valid: int
    invalid: int
    invalid_rate: Estimate
    valid_per_host_hour: Estimate
    confirmed: bool
    counted: bool
    reasons: list[str]
    resources: WindowResources
    leaks: LeakVerdict | None = None  # its leak check (measure/leaks.py); None: no leak samples


class LeakSamplesArtifact(Artifact):
    """What the harness held, sampled through one window (``experiments/leak_sampler.py``): rows of
    ``columns`` — ``t`` (wall clock, s) then the quantities of ``measure.leaks.QUANTITIES`` measured
    here (``daemon_mib`` only on docker and podman) — and the same quantities just before the window
    and just after its teardown."""

    KIND: ClassVar[str] = "leaks"
    substrate: str
    interval_s: float
    columns: list[str]
    rows: list[list[float | None]]
    before: dict[str, float | None]
    after: dict[str, float | None]
    sample_ms: float | None = None  # mean time one sample took
    notes: list[str] = Field(default_factory=list)  # e.g. a count that stopped at its cap
    # what ``mounts`` counted: the lines of the harness's mountinfo naming this run id; None: every
    # line (the host's whole table, shared with other users; samplers before the run's own count)
    mounts_of_run: str | None = None


class SweepSummaryArtifact(Artifact):
    """The sweep's verdict. ``valid_per_host_hour`` is from confirmed windows at N_max; None (and
    ``n_max`` None) when no window was confirmed: then there is no headline."""

    KIND: ClassVar[str] = "sweep"
    n_max: int | None
    soak: str | None
    invalid_threshold: float
    valid_per_host_hour: Estimate | None
    stopped: str | None
    soak_held: bool | None
    note: str
    leaks_passed: bool | None = None  # the sweep's leak verdict (``experiments.sweep.leak_summary``)
    leaks_note: str = ""


class PriceArtifact(Artifact):
    """USD per valid rollout on one priced host (owned, cloud with its billing minimum, EUR-priced)."""

    KIND: ClassVar[str] = "price"
    name: str
    kind: str
    usd_per_host_hour: float
    billed_usd_per_host_hour: float | None = None
    usd_per_valid_rollout: Estimate | None = None
    basis: str = ""  # what the throughput behind usd_per_valid_rollout was measured over
    note: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)


class PriceFilesArtifact(Artifact):
    """The price files a run was given, as given (so ``report`` can price it again)."""

    KIND: ClassVar[str] = "prices"
    files: list[PriceFile]


def stored_price_files(ledger: Ledger, run_id: str) -> list[PriceFile]:
    """The price files the run was given (empty when none)."""
    found = load(ledger, run_id, PriceFilesArtifact).get("files")
    return list(found.files) if found else []


# -- substrates ----------------------------------------------------------------------------------------

class ColdstartArtifact(Artifact):
    """One substrate's cold start (create -> first command), teardown, idle memory and resets."""

    KIND: ClassVar[str] = "coldstart"
    substrate: str
    mode: str
    isolation: str
    first_command: Latency
    success: Estimate
    teardown: Latency
    floor_argv: list[str] | None
    floor: Latency | None
    ratio_to_floor: float | None
    idle_memory_mib: float | None
    idle_pss_mib: float | None
    reset: dict[str, Latency]
    reset_ratio_recreate_over_in_place: float | None
    errors: list[str]


class DesktopColdstartArtifact(Artifact):
    """One substrate's desktop (``coldstart --tasks desktop``): a new sandbox to the first good
    screenshot of a task's document, the sandbox's share of it, and each reset strategy from a
    running instance to the next first good screenshot; beside the substrate's raw floor (an empty
    sandbox's start, measured in the same run)."""

    KIND: ClassVar[str] = "desktop-coldstart"
    substrate: str
    mode: str
    isolation: str
    task: str
    start: Latency  # create + the instance up to its first good screenshot
    create: Latency  # the sandbox's part of ``start``
    success: Estimate
    floor_argv: list[str] | None
    floor: Latency | None
    ratio_to_floor: float | None
    reset: dict[str, Latency]
    errors: list[str]


class ProbeArtifact(BaseModel):
    """One escape attempt: whether it ran, whether it was contained, and its positive control."""

    probe: str
    ran: bool
    contained: bool | None
    detail: str
    control: str
    control_detail: str = ""
    verdict: str


class IsolationArtifact(Artifact):
    """Escape attempts from inside one substrate's sandboxes, and its canary positive control."""

    KIND: ClassVar[str] = "isolation"
    substrate: str
    declared: str
    canary_control_fired: bool
    probes: list[ProbeArtifact]


class ProjectionArtifact(Artifact):
    """Worker-hours for a workload on one substrate, from measured terms."""

    KIND: ClassVar[str] = "projection"
    substrate: str
    trajectories: int
    steps: int
    cold_start_s: Estimate
    reset_s: Estimate
    per_step_s: Estimate
    verify_s: Estimate
    projected_s_per_trajectory: float | None
    measured_s_per_trajectory: float | None = None
    worker_hours: Estimate


# -- branching -----------------------------------------------------------------------------------------

class BranchNode(BaseModel):
    """One Ray node of a branch run for one method: the prepared state's transfer to it (apart from
    creation), and the continuations it created and checked (creation excludes the transfer)."""

    node_id: str
    label: str  # the node's custom resource (``node_<i>``) when it has one, else ``head``/its id
    host: str
    transfer_s: float  # ``ray.get`` of the shipped bytes on the node (object store to the node)
    unpack_s: float  # installing them on the node's substrate (``Shippable.unpack``)
    continuations: int
    faithful_all: Share
    creation_sequential: Latency
    seqs: list[int] = Field(default_factory=list)  # the continuations (ledger sequence numbers) it ran


class BranchMethodArtifact(Artifact):
    """One fork method's results: creation one at a time and all at once (samples and percentiles),
    faithfulness per dimension, the continuations' outcomes, throughput and cost, creation against k.

    Creation is the cost of making a continuation, wherever it was paid (``ForkMethod.fork_cost``:
    a pool's restore made ahead of demand counts its own phases); the hand-over is what the caller
    of ``fork`` waited (the same for a method that makes continuations on demand). Ledgers written
    before the hand-over was kept apart have ``handover_*`` None: their creation is the wall time
    of ``fork``, which for ``criu`` was the hand-over."""

    KIND: ClassVar[str] = "branch"
    method: str
    env: str
    task: str
    k: int
    prepare_s: float
    creation_sequential: Latency
    creation_parallel: Latency
    parallel_wall_s: float
    faithful: dict[str, Share]
    faithful_all: Share
    continuations: int
    valid: int
    success: int
    invalid: dict[str, int]
    valid_per_host_hour: Estimate
    usd_per_valid_continuation: Estimate
    creation_by_k: dict[str, Estimate]
    errors: list[str]
    executor: str = "local"
    shipped_bytes: int | None = None  # on Ray: the prepared state as shipped (``Shippable.pack``)
    pack_s: float | None = None  # on Ray: packing it on the driver
    put_s: float | None = None  # on Ray: ``ray.put`` of the bytes on the driver's node
    nodes: list[BranchNode] = Field(default_factory=list)  # on Ray: per node, transfer apart from creation
    handover_sequential: Latency | None = None  # the caller's wait per fork, one at a time
    handover_parallel: Latency | None = None  # the same, all at once
    made_ahead: int = 0  # continuations (one at a time) made before they were asked for (a pool)
    made_ahead_parallel: int = 0  # the same, all at once
    creation_phases: dict[str, Estimate] = Field(default_factory=dict)  # p50 per phase of the method's own split
    capture: Latency | None = None  # the faithfulness check per continuation: ``capture()`` + ``compare``
    span_s: float | None = None  # the continuations' span (one at a time, each run to the end)
    valid_times_s: list[float] = Field(default_factory=list)  # when each valid one ended, seconds into the span


class BranchRatio(BaseModel):
    """One method against the baseline (``replay``): valid continuations per host-hour (end to end:
    fork, check and run, the method's background work included) and the creation cost (restore
    included, wherever it was paid): baseline's median over the method's."""

    method: str
    baseline: str = "replay"
    end_to_end: Estimate  # method's valid per host-hour / baseline's
    creation: Estimate  # baseline's creation p50 / method's (one at a time)


def branch_ratios(methods: Sequence[BranchMethodArtifact], baseline: str = "replay") -> list[BranchRatio]:
    """Every method but the baseline against it, when the baseline ran (none otherwise)."""
    base = next((m for m in methods if m.method == baseline), None)
    if base is None:
        return []
    out = []
    for m in methods:
        if m is base:
            continue
        e2e = (rate_ratio(m.valid_times_s, m.span_s, base.valid_times_s, base.span_s)
               if m.span_s is not None and base.span_s is not None
               else Estimate(value=None, low=None, high=None, n=0, method="none"))
        out.append(BranchRatio(method=m.method, baseline=baseline, end_to_end=e2e,
                               creation=median_ratio(base.creation_sequential.samples_s,
                                                     m.creation_sequential.samples_s)))
    return out


class BranchSummaryArtifact(Artifact):
    """The whole branch run: the prepared state, whether forks left it unchanged, every method."""

    KIND: ClassVar[str] = "branch-summary"
    schema_: str = Field("drumsbench.branch-report/2", alias="schema")
    run_id: str
    task: str
    env: str
    substrate: str
    k: int
    prepared: dict[str, Any]
    prepared_unchanged: bool
    isolation_control_fired: bool
    methods: list[BranchMethodArtifact]
    price: HostPrice
    conditions: str
    executor: str = "local"  # ray: each method's ``nodes`` say where its continuations ran
    ratios: list[BranchRatio] = Field(default_factory=list)  # every other method against replay


class ScreenshotArtifact(Artifact):
    """A screen kept for people: PNG bytes inline (base64) or a path relative to the ledger's folder."""

    KIND: ClassVar[str] = "screenshot"
    task: str
    stage: str  # start, middle, end; prepared, continuation
    seq: int | None = None
    method: str | None = None
    note: str | None = None
    width: int | None = None
    height: int | None = None
    path: str | None = None
    png_base64: str | None = None


# -- a Ray cluster during a window -------------------------------------------------------------------

class ClusterNode(BaseModel):
    """One Ray node as the driver saw it around a window."""

    node_id: str
    host: str
    at_start: bool  # alive when the window started
    at_end: bool  # alive when it ended


class ClusterArtifact(Artifact):
    """What the Ray cluster was during one window (kind ``cluster``, name: the window's label),
    written by the sweep: its nodes at the start and end, how many ran the window (``used``: all,
    or 1 for a node-alone baseline window) and when the nodes were ready to work (``work_started``,
    after their set-up; ``None``: the segment's own start is used)."""

    KIND: ClassVar[str] = "cluster"
    nodes: list[ClusterNode]
    used: int | None = None  # None: every alive node
    work_started: float | None = None


# -- chaos -------------------------------------------------------------------------------------------

class RowsDigest(BaseModel):
    """The attempts recorded at one moment: how many, the largest seq, the seqs below it not
    recorded then (in flight, or dropped), and a SHA-256 over the rows' ``(seq, outcome, cause,
    t_end)`` in seq order (``measure.chaos.digest``). A later ledger holds the same attempts exactly
    when its rows with ``seq <= max_seq`` outside ``gaps`` give the same count and digest."""

    n: int = Field(ge=0)
    max_seq: int
    gaps: list[int] = Field(default_factory=list)
    sha256: str


class ChaosEventArtifact(Artifact):
    """One event a chaos run injected from outside the harness (``experiments/chaos.py``): when,
    what, on which target, the attempts recorded before it, and what followed."""

    KIND: ClassVar[str] = "chaos-event"
    index: int
    t: float  # wall clock when it was injected
    kind: str  # harness_kill, sandbox_kill, container_kill, desktop_kill, ledger_reader, disk_full
    target: str
    harness_segment: int  # which start of the harness (0: the first `run`, then each `run --resume`)
    before: RowsDigest  # the attempts recorded at the event (after the harness died, for a kill)
    attempts_after: int | None = None  # recorded once what followed was over
    hold_s: float | None = None  # ledger_reader, disk_full: how long it was held
    followed: str = ""
    harness_exit: int | None = None  # the harness's exit code when it ended because of the event
    stopped_t: float | None = None  # when the harness was seen dead (a kill; a full disk that stopped it)
    integrity: str | None = None  # the ledger's PRAGMA integrity_check after the event (disk_full)


class ChaosCheck(BaseModel):
    passed: bool
    detail: str


class ChaosSummaryArtifact(Artifact):
    """A chaos run's verdict: its checks (``measure.chaos``), each passed or not with a detail."""

    KIND: ClassVar[str] = "chaos"
    events: int
    by_kind: dict[str, int]
    attempts: int
    harness_starts: int
    checks: dict[str, ChaosCheck]
    passed: bool


# -- everything of one run -----------------------------------------------------------------------------

@dataclass
class RunArtifacts:
    """Every typed artifact of one run (what the renderers read), plus counts of unknown kinds."""

    segments: dict[str, SegmentArtifact] = field(default_factory=dict)
    windows: dict[str, WindowArtifact] = field(default_factory=dict)
    leaks: dict[str, LeakSamplesArtifact] = field(default_factory=dict)
    sweep: SweepSummaryArtifact | None = None
    prices: dict[str, PriceArtifact] = field(default_factory=dict)
    coldstart: dict[str, ColdstartArtifact] = field(default_factory=dict)
    desktop_coldstart: dict[str, DesktopColdstartArtifact] = field(default_factory=dict)
    isolation: dict[str, IsolationArtifact] = field(default_factory=dict)
    projection: dict[str, ProjectionArtifact] = field(default_factory=dict)
    branch: dict[str, BranchMethodArtifact] = field(default_factory=dict)
    branch_summary: BranchSummaryArtifact | None = None
    screenshots: dict[str, ScreenshotArtifact] = field(default_factory=dict)
    chaos_events: dict[str, ChaosEventArtifact] = field(default_factory=dict)
    chaos: ChaosSummaryArtifact | None = None
    train: TrainReport | None = None
    other_kinds: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # kind -> why it could not be read


@dataclass(frozen=True)
class Loaded:
    """How ``load_run`` fills one ``RunArtifacts`` field: with every artifact of ``model`` by key,
    or (``key``) with the one stored under that key."""

    field: str
    model: type[Artifact]
    key: str | None = None


# The one registration of an artifact kind that the report reads: its model, the ``RunArtifacts``
# field it fills and how (a new section adds its model above, its field to ``RunArtifacts`` and a
# line here; its renderer registers in ``report/html/page.py`` with the kinds it shows)
LOADED: tuple[Loaded, ...] = (
    Loaded("segments", SegmentArtifact), Loaded("windows", WindowArtifact), Loaded("leaks", LeakSamplesArtifact),
    Loaded("sweep", SweepSummaryArtifact, "summary"), Loaded("prices", PriceArtifact),
    Loaded("coldstart", ColdstartArtifact), Loaded("desktop_coldstart", DesktopColdstartArtifact),
    Loaded("isolation", IsolationArtifact), Loaded("projection", ProjectionArtifact),
    Loaded("branch", BranchMethodArtifact), Loaded("branch_summary", BranchSummaryArtifact, "report"),
    Loaded("screenshots", ScreenshotArtifact), Loaded("chaos_events", ChaosEventArtifact),
    Loaded("chaos", ChaosSummaryArtifact, "summary"),
)
# kinds a run stores that are read elsewhere (not through ``LOADED``): not "other kinds"
READ_ELSEWHERE = {
    PriceFilesArtifact.KIND, ClusterArtifact.KIND, TrainReport.KIND, POOL_KIND,
    "coldstart-pool",  # measure.pool.PoolColdstartArtifact (it builds on this module: named, not imported)
}
KNOWN_KINDS = {entry.model.KIND for entry in LOADED} | READ_ELSEWHERE


def load_run(ledger: Ledger, run_id: str) -> RunArtifacts:
    """Every artifact of the run, typed. A kind whose stored data does not fit its model is left
    empty and its error kept in ``errors`` (a renderer says so in place of that section)."""
    counts = {r[0]: r[1] for r in ledger.db.execute(
        "SELECT kind, COUNT(*) FROM artifacts WHERE run_id = ? GROUP BY kind", (run_id,))}
    out = RunArtifacts(other_kinds={k: n for k, n in counts.items() if k not in KNOWN_KINDS})

    def get(model: type[A]) -> dict[str, A]:
        if model.KIND not in counts:
            return {}
        try:
            return load(ledger, run_id, model)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            out.errors[model.KIND] = f"{model.KIND} artifact does not fit its model: {where}: {first['msg']}"
            return {}

    for entry in LOADED:
        got = get(entry.model)
        setattr(out, entry.field, got if entry.key is None else got.get(entry.key))
    if TrainReport.KIND in counts:
        try:
            out.train = TrainReport.model_validate(ledger.artifacts(run_id, TrainReport.KIND)["report"])
        except (ValidationError, KeyError) as e:
            out.errors[TrainReport.KIND] = f"{TrainReport.KIND} artifact does not fit its model: {e}"[:300]
    return out
