"""A synthetic ledger with every section the HTML report can show.

Used by ``benchmarks/report_100k.py`` (a 100,000-attempt ledger) and by the HTML report's tests,
and handy to see the report of an experiment before the experiment exists:

    python -m drumsbench.testing.sample_ledger OUT_DIR [ATTEMPTS]
    drumsbench report RUN --out OUT_DIR --html r.html

Attempts go through ``Ledger.record`` like real ones; their timings are drawn from log-normal
distributions of plausible size per substrate. Segment times are then set to the simulated
timeline (one segment per window). The artifacts are the typed models of ``measure/artifacts.py``,
written exactly as the real commands write them. Nothing here is a measurement: the run's commit is
``synthetic`` and its config says so.
"""

from __future__ import annotations

import base64
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

from drumsbench.core.machine import machine_info
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts as art
from drumsbench.measure.cost import DEFAULT_PRICE
from drumsbench.measure.stats import Estimate, inverse, rate_per_hour, wilson

# relative cost of starting / resetting a sandbox on each substrate
SCALE = {"process": 1.0, "bwrap": 1.6, "overlay": 1.3, "docker": 5.0, "podman": 6.0}
CAUSES = list(InvalidCause)
CAUSE_WEIGHTS = np.array([3, 2, 3, 1, 2, 2, 0.5, 1.5, 1.0])


def png(width: int, height: int, rgb: np.ndarray) -> bytes:
    """Encode an (h, w, 3) uint8 array as PNG (no dependency)."""
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def fake_screen(seed: int, stage: int, width: int = 320, height: int = 200) -> bytes:
    """A small mock desktop: a title bar, a document page and some 'text' lines."""
    rng = np.random.default_rng(seed)
    img = np.full((height, width, 3), (222, 226, 232), dtype=np.uint8)
    img[0:18, :] = (52, 101, 164)
    img[18:34, :] = (245, 245, 245)
    img[44:height - 10, 40:width - 40] = 255
    for i in range(3 + stage * 4):
        y = 56 + i * 9
        if y + 4 >= height - 12:
            break
        img[y:y + 4, 52:52 + int(rng.integers(60, width - 110))] = (40, 40, 40)
    img[56:60, 52 + 30 * stage:54 + 30 * stage] = (0, 0, 0)  # the cursor
    return png(width, height, img)


def synthesize(ledger: Ledger, run_id: str, attempts: int = 100_000, *, seed: int = 0,
               substrates: tuple[str, ...] = ("process", "bwrap", "docker"),
               concurrency: tuple[int, ...] = (1, 2, 4, 8, 16), soak: bool = True, artifacts: bool = True,
               control_fires: bool = True) -> None:
    """Write a sweep-shaped run of ``attempts`` attempts (and, with ``artifacts``, every artifact kind)."""
    rng = np.random.default_rng(seed)
    cfg = {"substrate": substrates[0], "substrates": list(substrates), "tasks": "coding", "policy": "noisy",
           "noisy_p": 0.6, "concurrency": max(concurrency), "synthetic": True,
           "note": "synthetic ledger from drumsbench.testing.sample_ledger: not a measurement",
           "price": {"name": "default", "usd_per_host_hour": 0.1, "note": "stated default"}}
    ledger.create_run(run_id, "sweep", cfg, machine_info(), "synthetic")

    windows = [(f"N={n}", n, "window") for n in concurrency]
    n_max = concurrency[-2] if len(concurrency) > 1 else concurrency[0]
    if soak:
        windows.append((f"soak N={n_max}", n_max, "soak"))
    weights = np.array([n * (2.0 if role == "soak" else 1.0) for _, n, role in windows], dtype=float)
    counts = np.floor(weights / weights.sum() * attempts).astype(int)
    counts[-1] += attempts - counts.sum()

    t0 = 1.7e9
    seq = 0
    tasks = [f"coding/task-{i:02d}" for i in range(15)]
    for (label, n, role), count in zip(windows, counts, strict=True):
        seg = ledger.start_segment(run_id, 0, label)
        p_invalid = 0.004 if n < max(concurrency) else 0.03  # the top N breaks the invalid-rate threshold
        worker_t = np.full(n, t0) + rng.uniform(0, 0.05, n)
        end = t0
        valid_times: list[float] = []
        n_valid = 0
        for _ in range(int(count)):
            w = int(np.argmin(worker_t))
            sub = substrates[seq % len(substrates)]
            sc = SCALE.get(sub, 2.0) * (1 + 0.02 * n)  # contention grows with N
            created = rng.random() < 0.3
            prov = float(rng.lognormal(np.log(0.02 * sc), 0.35)) if created else 0.0
            reset = float(rng.lognormal(np.log(0.012 * sc), 0.45))
            steps = [round(float(v), 6) for v in rng.lognormal(np.log(0.01 * sc), 0.6, int(rng.integers(2, 12)))]
            verify = float(rng.lognormal(np.log(0.22), 0.25))
            teardown = float(rng.lognormal(np.log(0.008 * sc), 0.4)) if created else 0.0
            total = prov + reset + sum(steps) + verify + teardown + 0.002
            t_start = float(worker_t[w])
            t_end = t_start + total
            worker_t[w] = t_end + 0.001
            end = max(end, t_end)
            cause: InvalidCause | None
            injected: InvalidCause | None
            if rng.random() < p_invalid:
                cause = CAUSES[int(rng.choice(len(CAUSES), p=CAUSE_WEIGHTS / CAUSE_WEIGHTS.sum()))]
                injected = cause if rng.random() < 0.5 else None
                outcome, reward = Outcome.INVALID, None
            else:
                cause = injected = None
                ok = rng.random() < 0.62
                outcome, reward = (Outcome.SUCCESS, 1.0) if ok else (Outcome.FAILED, 0.0)
                n_valid += 1
                valid_times.append(t_end - t0)
            ledger.record(AttemptRecord(
                run_id=run_id, seq=seq, task=tasks[seq % len(tasks)], substrate=sub, env="coding", policy="noisy",
                worker=w, concurrency=n, window=label, generation=seq % 7 + 1, outcome=outcome, cause=cause,
                reward=reward, injected=injected, t_start=t_start, t_end=t_end, provision_s=prov, reset_s=reset,
                steps_s=steps, verify_s=verify, teardown_s=teardown))
            seq += 1
        with ledger.tx() as db:
            db.execute("UPDATE segments SET started = ?, ended = ? WHERE run_id = ? AND seg = ?",
                       (t0, end, run_id, seg))
        fired = control_fires or role != "window" or n != concurrency[0]
        detail = "canary leaked between two sandboxes " + ("was detected" if fired else "was NOT detected")
        ledger.record_control(run_id, label, "isolation", fired, detail)
        if artifacts:
            span = end - t0
            thr = rate_per_hour(valid_times, span)
            inv = wilson(int(count) - n_valid, int(count))
            confirmed = role != "burst" and (inv.value or 0) <= 0.01 and fired
            reasons = [f"ran its full length ({span:.0f} s)",
                       f"invalid rate {inv.value:.3%} {'<=' if (inv.value or 0) <= 0.01 else '>'} 1% threshold",
                       "isolation positive control " + ("fired" if fired else "did not fire"),
                       "throughput stable (halves within 10%)"]
            art.put(ledger, run_id, label, art.WindowArtifact(
                concurrency=n, role=role, planned_s=round(span), ran_s=span, attempts=int(count),
                valid=n_valid, invalid=int(count) - n_valid, invalid_rate=inv, valid_per_host_hour=thr,
                confirmed=confirmed, counted=confirmed and n == n_max, reasons=reasons,
                resources=art.WindowResources(cpu_busy=round(min(1.0, 0.1 * n), 2),
                                                    mem_gib=round(0.4 + 0.15 * n, 2), sandboxes=n)))
        t0 = end + 5.0
    if not artifacts:
        return

    nmax_thr = art.load(ledger, run_id, art.WindowArtifact)[f"N={n_max}"].valid_per_host_hour
    art.put(ledger, run_id, "summary", art.SweepSummaryArtifact(
        n_max=n_max, soak=f"soak N={n_max}" if soak else None, invalid_threshold=0.01,
        valid_per_host_hour=nmax_thr, stopped=f"N={max(concurrency)}: invalid rate above the threshold",
        soak_held=soak, note=f"N_max={n_max} (synthetic)"))
    basis = f"confirmed windows at N_max = {n_max}"
    for name, kind, usd, billed, note, inputs in (
            ("owned", "owned", 0.071, None, "USD 2,400 over 36 months + 95 W x 1.4 PUE x USD 0.30/kWh",
             {"purchase_usd": 2400, "months": 36, "watts": 95, "pue": 1.4, "usd_per_kwh": 0.30}),
            ("cloud", "cloud", 0.0832, 0.0832 * 24 * 3600 / max(1.0, t0 - 1.7e9),
             "on-demand USD 0.0832/h, billed with a 24-hour minimum", {"usd_per_hour": 0.0832}),
            ("cloud_eur", "cloud_eur", 0.0714 * 1.08, None, "EUR 0.0714/h at 1.08 USD/EUR (rate of 2025-01-15)",
             {"eur_per_hour": 0.0714, "usd_per_eur": 1.08, "rate_date": "2025-01-15"})):
        art.put(ledger, run_id, name, art.PriceArtifact(
            name=name, kind=kind, usd_per_host_hour=usd, billed_usd_per_host_hour=billed,
            usd_per_valid_rollout=inverse(nmax_thr, usd), basis=basis, note=note, inputs=inputs))
    for sub in substrates:
        sc = SCALE.get(sub, 2.0)
        first = art.latency([float(v) for v in rng.lognormal(np.log(0.03 * sc), 0.3, 60)])
        floor = art.latency([float(v) for v in rng.lognormal(np.log(0.02 * sc), 0.2, 60)])
        resets = {s: art.latency([float(v) for v in rng.lognormal(np.log(0.01 * sc * f), 0.3, 10)])
                  for s, f in (("in_place", 1.0), ("recreate", 2.5))}
        art.put(ledger, run_id, sub, art.ColdstartArtifact(
            substrate=sub, mode="sequential", isolation="synthetic", first_command=first, success=wilson(60, 60),
            teardown=art.latency([0.005 * sc] * 60), floor_argv=["true"], floor=floor,
            ratio_to_floor=(first.p50.value or 0) / (floor.p50.value or 1), idle_memory_mib=2.0 * sc,
            idle_pss_mib=None, reset=resets, reset_ratio_recreate_over_in_place=2.5, errors=[]))
    dims = ["pixels", "text", "cursor", "selection", "undo", "modified", "dialogs", "locks"]
    methods = {"replay": (1.9, 0.15, {}), "file": (1.1, 0.1, {"undo": 0, "cursor": 3, "selection": 2, "dialogs": 10}),
               "criu": (0.24, 0.08, {})}
    m = 16
    branch: list[art.BranchMethodArtifact] = []
    for method, (base, spread, lost) in methods.items():
        per_k = {k: base * (k / 5 if method == "replay" else 1.0) + 0.05 for k in (1, 5, 20)}
        one_by_one = art.latency([float(v) for v in rng.lognormal(np.log(per_k[5]), spread, m)])
        # criu's pool makes its continuations ahead of demand: the caller waits a hand-over, not a restore
        pooled = method == "criu"
        handover = [float(v) for v in rng.lognormal(np.log(2e-4), 0.3, m)] if pooled else one_by_one.samples_s
        faithful = {d: art.Share(faithful=lost.get(d, m), total=m) for d in dims}
        valid = min(v.faithful for v in faithful.values())
        per_continuation = per_k[5] + 1.0 + 4.0  # fork, the check, the run
        span = m * (per_continuation - (per_k[5] if pooled else 0.0))
        valid_times = sorted(float(t) for t in rng.uniform(0, span, valid))
        thr = rate_per_hour(valid_times, span)
        branch.append(art.BranchMethodArtifact(
            method=method, env="desktop", task="writer-bold-word", k=5, prepare_s=1.0, creation_sequential=one_by_one,
            creation_parallel=art.latency([float(v) for v in rng.lognormal(np.log(per_k[5] * 1.4), spread, m)]),
            parallel_wall_s=per_k[5] * 2, faithful=faithful,
            faithful_all=art.Share(faithful=valid, total=m), continuations=m, valid=valid, success=valid // 2,
            invalid={"dirty_reset": m - valid} if valid < m else {}, valid_per_host_hour=thr,
            usd_per_valid_continuation=inverse(thr, 0.1),
            creation_by_k={str(k): Estimate(value=v, low=v * 0.9, high=v * 1.1, n=3, method="order-statistics")
                           for k, v in per_k.items()}, errors=[],
            handover_sequential=art.latency(handover), handover_parallel=art.latency(handover),
            made_ahead=m if pooled else 0, made_ahead_parallel=3 if pooled else 0,
            creation_phases={"restore_s": Estimate(value=0.2, low=0.18, high=0.23, n=m, method="order-statistics")}
            if pooled else {},
            capture=art.latency([float(v) for v in rng.lognormal(np.log(0.95), 0.05, m)]), span_s=span,
            valid_times_s=valid_times))
        art.put(ledger, run_id, method, branch[-1])
    art.put(ledger, run_id, "report", art.BranchSummaryArtifact(
        run_id=run_id, task="writer-bold-word", env="desktop", substrate="process", k=5, prepared={},
        prepared_unchanged=True, isolation_control_fired=control_fires, methods=branch, price=DEFAULT_PRICE,
        conditions="synthetic", ratios=art.branch_ratios(branch)))
    for sub in substrates:
        sc = SCALE.get(sub, 2.0)
        cold, reset, step, verify = 0.03 * sc, 0.012 * sc, 0.011 * sc, 0.22
        per_traj = cold + 150 * step + verify

        def est(v: float, n: int, rel: float = 0.1) -> Estimate:
            return Estimate(value=v, low=v * (1 - rel), high=v * (1 + rel), n=n, method="order-statistics")

        art.put(ledger, run_id, sub, art.ProjectionArtifact(
            substrate=sub, trajectories=1_000_000, steps=150, cold_start_s=est(cold, 60), reset_s=est(reset, 60),
            per_step_s=est(step, 9000, 0.05), verify_s=est(verify, 60), projected_s_per_trajectory=per_traj,
            measured_s_per_trajectory=per_traj * float(rng.uniform(0.9, 1.12)),
            worker_hours=est(per_traj * 1e6 / 3600, 60, 0.07)))
    for t, task in enumerate(("writer-bold-word", "calc-sum-column")):
        for s, stage in enumerate(("start", "middle", "end")):
            art.put(ledger, run_id, f"{task}/{100 + t}/{stage}", art.ScreenshotArtifact(
                task=task, seq=100 + t, stage=stage, width=320, height=200,
                png_base64=base64.b64encode(fake_screen(t, s)).decode()))
    ledger.set_status(run_id, "complete")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs-sample")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    led = Ledger(out / "ledger.sqlite")
    rid = f"sample-{len(led.runs()) + 1}"
    synthesize(led, rid, n)
    print(rid)
