"""What the page knows of one run: its report, phase samples, timelines, artifacts and priced hosts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import WHOLE_RUN, PriceArtifact, RunArtifacts, load_run, stored_price_files
from drumsbench.measure.cost import PriceFile
from drumsbench.measure.stats import Estimate, inverse
from drumsbench.measure.summary import RunReport, _offsets, build, columns


@dataclass
class RunData:
    report: RunReport
    run: dict[str, Any]
    index: int
    label: str
    samples: dict[str, dict[str, np.ndarray]]  # substrate -> phase -> seconds
    timeline: tuple[np.ndarray, np.ndarray]  # offsets (s) on the run's host timeline: valid, invalid
    window_times: dict[str, tuple[np.ndarray, np.ndarray, float]]  # window -> (t_end valid, t_end invalid, t0)
    art: RunArtifacts
    prices: list[PriceArtifact] = field(default_factory=list)  # priced hosts (computed, never stored here)

    @property
    def has_attempts(self) -> bool:
        return self.report.attempts > 0


def load_run_data(ledger: Ledger, run_id: str, index: int, report: RunReport | None,
                  price_files: Sequence[PriceFile] = ()) -> RunData:
    c = columns(ledger, run_id)  # one pass over the attempts, shared with the run report
    rep = report or build(ledger, run_id, cols=c)
    run = ledger.run(run_id)
    total = c.t_end - c.t_start
    # phase samples per substrate (same inclusion rules as the run report: zero = phase not run)
    samples: dict[str, dict[str, np.ndarray]] = {}
    for sub in dict.fromkeys(c.substrate.tolist()):
        m = c.substrate == sub
        p, v, td = c.provision[m], c.verify[m], c.teardown[m]
        samples[sub] = {"provision": p[p != 0], "reset": c.reset[m], "step": c.steps.get(sub, np.empty(0)),
                        "verify": v[v != 0], "teardown": td[td != 0], "attempt": total[m]}
    offs = _offsets(ledger.segments(run_id), c.t_end)
    timeline = (offs[c.ok], offs[~c.ok])
    art = load_run(ledger, run_id)
    window_times: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    for name in art.windows:
        m = c.window == name
        if m.any():
            window_times[name] = (c.t_end[m & c.ok], c.t_end[m & ~c.ok], float(c.t_start[m].min()))
    rd = RunData(rep, run, index, run_id, samples, timeline, window_times, art)
    rd.prices = _priced(rd, list(price_files) or stored_price_files(ledger, run_id))
    return rd


def _priced(rd: RunData, files: Sequence[PriceFile]) -> list[PriceArtifact]:
    """The run's priced hosts: the sweep's own figures (from confirmed windows) when it stored them,
    else each host of the price files (or the run's configured price) over the headline's basis."""
    if rd.art.prices and not files:
        return list(rd.art.prices.values())
    thr, basis = throughput_basis(rd)
    hours = rd.report.host_seconds / 3600
    hosts = [h for f in files for h in f.hosts()] or [rd.report.price]
    out = []
    for h in hosts:
        billed = h.usd_per_host_hour * h.billed_hours(hours) / hours if hours > 0 else h.usd_per_host_hour
        out.append(PriceArtifact(
            kind=h.kind, usd_per_host_hour=h.usd_per_host_hour,
            billed_usd_per_host_hour=billed if h.billed_hours(hours) > hours else None,
            usd_per_valid_rollout=inverse(thr, h.usd_per_host_hour) if thr is not None else None, basis=basis,
            name=h.name, note=h.note, inputs={"minimum_billed_hours": h.minimum_billed_hours}))
    return out


def throughput_basis(rd: RunData) -> tuple[Estimate | None, str]:
    """Valid rollouts per host-hour for the headline, and what it was measured over.

    A sweep: its confirmed windows at N_max, or None (no headline) when no window was confirmed.
    Any other run: the whole run, labelled as such."""
    sweep = rd.art.sweep
    if sweep is not None:
        if sweep.n_max is None or sweep.valid_per_host_hour is None or not sweep.valid_per_host_hour.value:
            return None, "no confirmed window: no headline is claimed"
        return sweep.valid_per_host_hour, f"confirmed windows at N_max = {sweep.n_max}"
    return rd.report.valid_per_host_hour, WHOLE_RUN
