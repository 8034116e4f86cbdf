"""``drumsbench sweep``: confirmed windows at rising concurrency, a soak, bursts, USD per valid rollout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import (
    console,
    duration_or_none,
    err,
    parse_duration,
    parse_int_list,
    parse_reset,
    progress_lines,
    rollout_config,
    usage_error,
    write_json,
)
from drumsbench.cli.prices import load_price_files

if TYPE_CHECKING:
    from drumsbench.measure.windows import WindowVerdict



def sweep(
    substrate: o.Substrate = "process",
    tasks: o.Tasks = "coding",
    policy: Annotated[str, typer.Option(help="oracle, null, noisy, explorer or adversary[:NAME,...].")] = "oracle",
    noisy_p: o.NoisyP = 0.5,
    explorer_steps: o.ExplorerSteps = 20,
    think_time: o.ThinkTime = "0s",
    concurrency: Annotated[str, typer.Option(help="Concurrency of each window, increasing.")] = "1,2,4,8,16",
    window: Annotated[str, typer.Option(help="Length of each window (design value 15m).")] = "15m",
    soak: Annotated[str, typer.Option(help="Soak at N_max (design value 60m); 'none' to skip.")] = "60m",
    burst: Annotated[str | None, typer.Option(help="Also run a short burst this long (reported as a burst).")] = None,
    burst_concurrency: Annotated[int | None, typer.Option(help="Burst concurrency (default: the largest N).")] = None,
    invalid_threshold: Annotated[float, typer.Option(help="A window's invalid rate must be at most this.")] = 0.01,
    stability: Annotated[float, typer.Option(help="A window's two halves must agree within this fraction.")] = 0.25,
    min_gain: Annotated[float, typer.Option(help="Keep climbing while throughput gains more than this.")] = 0.05,
    inject: o.Inject = "",
    inject_at: Annotated[str | None, typer.Option(help="Inject only in the windows at these N, e.g. 2.")] = None,
    step_timeout: o.StepTimeout = "30s",
    episode_timeout: o.EpisodeTimeout = "300s",
    reset: o.Reset = "auto",
    pool: o.Pool = "auto",
    verifier: o.Verifier = None,
    seed: o.Seed = 0,
    price: o.Price = None,
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
    executor: Annotated[str, typer.Option(help="local (in process) or ray (--concurrency per node).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="ray: auto or HOST:PORT to join; none: a local Ray.")] = None,
) -> None:
    """Confirmed windows at rising concurrency: N_max, a soak at N_max, bursts, USD per valid rollout."""
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.envs import suites
    from drumsbench.executors.ray import executor_options
    from drumsbench.experiments.run import RunConfig, make_substrate, new_run_id, open_ledger
    from drumsbench.experiments.sweep import SweepConfig, build, publish, run_sweep
    from drumsbench.policies.scripted import make_policy
    from drumsbench.report.sweep import print_sweep
    from drumsbench.rollout.faults import FaultPlan
    from drumsbench.rollout.pool import parse_pool

    o.use_verifier(verifier)
    reset_to = parse_reset(reset)
    levels = parse_int_list(concurrency, "--concurrency")
    window_s = parse_duration(window, "--window")
    soak_s = duration_or_none(soak, "--soak")
    burst_s = duration_or_none(burst, "--burst")
    at = parse_int_list(inject_at, "--inject-at") if inject_at is not None else None
    prices = load_price_files(price)
    try:
        rollout = rollout_config(step_timeout, episode_timeout, think_time, reset_to)
        extra: dict[str, Any] = {"price": prices[0].hosts()[0]} if prices else {}
        extra.update(executor_options(executor, ray_address))
        base = RunConfig(substrate=substrate, tasks=tasks, policy=policy, noisy_p=noisy_p,
                         explorer_steps=explorer_steps, concurrency=1, duration_s=window_s, inject=inject,
                         seed=seed, rollout=rollout, pool=parse_pool(pool), **extra)
        cfg = SweepConfig(base=base, concurrency=levels, window_s=window_s, soak_s=soak_s, burst_s=burst_s,
                          burst_concurrency=burst_concurrency, invalid_threshold=invalid_threshold,
                          stability=stability, min_gain=min_gain, inject_at=at, prices=prices)
    except ValidationError as e:
        raise usage_error(e) from None  # every field's flag is --field-name
    FaultPlan.parse(cfg.base.inject)
    make_policy(policy, noisy_p, explorer_steps)
    suites.load(tasks)
    ledger = open_ledger(out)
    run_id = new_run_id()
    make_substrate(substrate, run_id, tasks)
    ledger.create_run(run_id, "sweep", cfg.model_dump(mode="json"), machine_info(), commit())
    planned = len(levels) * window_s + (soak_s or 0) + (burst_s or 0)
    err.print(f"sweep {run_id}: {substrate}, {tasks}, policy {policy}, N in {levels}, windows of {window_s:g} s"
              f"{f', soak {soak_s:g} s' if soak_s else ''}{f', burst {burst_s:g} s' if burst_s else ''}, "
              f"warm pool {'off' if base.pool == 0 else base.pool} "
              f"(at most {planned:g} s); ledger {ledger.path}")

    with progress_lines(progress) as say:
        def started(label: str, n: int, seconds: float) -> None:
            say(f"  window {label}: N={n} for {seconds:g} s ...")

        def finished(v: WindowVerdict) -> None:
            say(f"  window {v.label}: {v.attempts} attempts, {v.valid_per_host_hour.fmt('.4g')} valid/host-h -> "
                f"{v.verdict_line()}")

        status = run_sweep(ledger, run_id, cfg, on_window=finished, on_start=started)
    report = build(ledger, run_id)
    publish(ledger, run_id, report)
    print_sweep(report, console)
    write_json(report.dump(), out / run_id, "sweep-report.json", json_path)
    if status == "interrupted":
        err.print("interrupted: the window that was cut short is not confirmed; the report above is final")
        raise typer.Exit(130)
