"""``drumsbench run``: attempts on one substrate, then the run's report."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import err, live, parse_duration, parse_reset, rollout_config, usage_error
from drumsbench.cli.prices import remember_prices, run_price
from drumsbench.cli.report import show_report
from drumsbench.core.errors import UsageError

# configuration fields whose flag is not ``--field-name`` (without a ``_s`` unit suffix)
FLAGS = {"max_attempts": "--attempts"}


def run(
    substrate: o.Substrate = "process",
    tasks: o.Tasks = "coding",
    policy: o.Policy = "oracle",
    noisy_p: o.NoisyP = 0.5,
    explorer_steps: o.ExplorerSteps = 20,
    endpoint: Annotated[str | None, typer.Option(help="endpoint: OpenAI-compatible base URL, e.g. "
                                                 "http://127.0.0.1:8001/v1.")] = None,
    model: Annotated[str | None, typer.Option(help="endpoint: the model name the endpoint serves.")] = None,
    think_time: o.ThinkTime = "0s",
    concurrency: o.Concurrency = None,
    duration: o.Duration = "30s",
    attempts: Annotated[int | None, typer.Option(help="Stop after this many attempts.")] = None,
    inject: o.Inject = "",
    step_timeout: o.StepTimeout = "30s",
    episode_timeout: o.EpisodeTimeout = "300s",
    verify_timeout: o.VerifyTimeout = "task",
    reset: o.Reset = "auto",
    pool: o.Pool = "auto",
    verifier: o.Verifier = None,
    watch: Annotated[bool, typer.Option("--watch", help="Sample leaks beside the run (fds, processes, mounts, "
                                        "/tmp, /dev/shm, store, daemon memory) and judge their slopes, as a "
                                        "sweep's soak does.")] = False,
    seed: o.Seed = 0,
    usd_per_host_hour: Annotated[float | None, typer.Option(help="Host price for the headline.")] = None,
    price: o.Price = None,
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    resume: Annotated[str | None, typer.Option(help="Continue this run id from the ledger in --out.")] = None,
    progress: o.Progress = True,
    executor: Annotated[str, typer.Option(help="local (in process) or ray (--concurrency per node).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="ray: auto or HOST:PORT to join; none: a local Ray.")] = None,
) -> None:
    """Run attempts and print the report."""
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.experiments.run import RunConfig, execute, new_run_id, open_ledger
    from drumsbench.measure.cost import HostPrice
    from drumsbench.rollout.pool import parse_pool

    o.use_verifier(verifier)
    ledger = open_ledger(out)
    if resume:
        meta = ledger.run(resume)
        if meta["status"] == "complete":
            raise UsageError(f"--resume: run {resume} is already complete; `drumsbench report {resume}` shows it")
        cfg = RunConfig.model_validate(meta["config"])
        run_id = resume
    else:
        from drumsbench.policies.endpoint import policy_name

        policy = policy_name(policy, endpoint, model)  # --policy endpoint --endpoint URL --model NAME
        reset_to = parse_reset(reset)
        try:
            rollout = rollout_config(step_timeout, episode_timeout, think_time, reset_to, verify_timeout)
            extra: dict[str, Any] = {}
            if concurrency is not None:
                extra["concurrency"] = concurrency
            extra["pool"] = parse_pool(pool)
            if executor == "ray" and pool == "auto":
                extra["pool"] = 0  # each Ray node makes its own sandboxes
            if price:
                extra["price"] = run_price(price)
            from drumsbench.executors.ray import executor_options

            extra.update(executor_options(executor, ray_address))  # one-line errors for both flags
            if usd_per_host_hour is not None:
                extra["price"] = HostPrice(name="given", usd_per_host_hour=usd_per_host_hour,
                                           note="given with --usd-per-host-hour")
            cfg = RunConfig(substrate=substrate, tasks=tasks, policy=policy, noisy_p=noisy_p,
                            explorer_steps=explorer_steps, duration_s=parse_duration(duration, "--duration"),
                            max_attempts=attempts, inject=inject, seed=seed, rollout=rollout, watch=watch,
                            **extra)
        except ValidationError as e:
            raise usage_error(e, FLAGS) from None
        run_id = new_run_id()
        # Validate everything that can be wrong before the ledger records a run.
        from drumsbench.envs import suites
        from drumsbench.experiments.run import check_policy, make_substrate
        from drumsbench.rollout.faults import FaultPlan

        FaultPlan.parse(cfg.inject)
        check_policy(cfg, suites.load(cfg.tasks).kind)
        make_substrate(cfg.substrate, run_id, cfg.tasks)
        ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
        remember_prices(ledger, run_id, price)

    pool_note = f"warm pool {cfg.pool_size()}" if cfg.pool_size() else "no warm pool"
    err.print(f"run {run_id}: {cfg.substrate}, {cfg.tasks}, policy {cfg.policy}, concurrency {cfg.concurrency}, "
              f"{pool_note}, ledger {ledger.path}")
    display = live(progress)

    def show(p: Any) -> None:
        import time

        from drumsbench.report.terminal import progress_grid

        if display is not None:
            display.update(progress_grid(time.monotonic() - p.started, p.counts))

    if display is not None:
        display.start()
    try:
        status, _ = execute(ledger, run_id, cfg, resume=bool(resume), on_progress=show if display else None)
    finally:
        if display is not None:
            display.stop()
    show_report(ledger, run_id, out, json_path, price, publish=True)
    if status == "interrupted":
        err.print(f"interrupted: continue with `drumsbench run --resume {run_id} --out {out}`")
        raise typer.Exit(130)

