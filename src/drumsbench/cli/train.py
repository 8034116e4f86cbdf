"""``drumsbench train``: a GRPO-style training run per treatment of invalid attempts, side by side.

torch is imported only when this command trains (``pip install drumsbench[train]``)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, err, live, names, parse_duration, parse_int_list, usage_error, write_json
from drumsbench.core.errors import UsageError


def _seeds(seeds: int, seed_list: str | None, base: int) -> list[int]:
    if seed_list:
        out = parse_int_list(seed_list, "--seed-list")
        if len(set(out)) != len(out):
            raise UsageError(f"--seed-list: {seed_list!r} must name distinct seeds")
        return out
    if not 1 <= seeds <= 100:
        raise UsageError(f"--seeds: {seeds} is out of range; give 1 to 100")
    return list(range(base, base + seeds))


def _choices(text: str, allowed: tuple[str, str], flag: str) -> list[str]:
    """'on', 'off' or 'on,off' (each of ``allowed`` at most once)."""
    out = names(text)
    if not out or any(x not in allowed for x in out) or len(set(out)) != len(out):
        raise UsageError(f"{flag}: {text!r}; give {allowed[0]}, {allowed[1]} or {allowed[0]},{allowed[1]}")
    return out


def train(
    treatments: Annotated[str, typer.Option(help="Treatments of invalid attempts: exclude, zero, mask, retry.")]
    = "exclude,zero,mask,retry",
    seeds: Annotated[int, typer.Option(help="Number of seeds (base, base+1, ...).")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="First seed (with --seeds).")] = 0,
    seed_list: Annotated[str | None, typer.Option(help="Explicit seeds, e.g. 3,7,11 (overrides --seeds).")] = None,
    faults: Annotated[str, typer.Option(help="correlated (with the action/task), uniform or none.")] = "correlated",
    start: Annotated[str, typer.Option(help="How group members start: scratch, fork (forked from one prepared "
                                            "parent per group) or scratch,fork (the cost contrast).")] = "scratch",
    prefix_k: Annotated[int, typer.Option(help="Prefix actions before the policy decides (0-2: read, test).")] = 0,
    integrity: Annotated[str, typer.Option(help="Verifier integrity: on; off or on,off only for the integrity "
                                                "contrast (a forgeable verdict in training, eval always on).")]
    = "on",
    fault_scale: Annotated[float, typer.Option(help="Multiply every fault rate (0 to 10).")] = 1.0,
    tasks: Annotated[str, typer.Option("--tasks", help="Coding suite (built-in name or folder).")] = "coding",
    task_ids: Annotated[str | None, typer.Option(help="Only these task ids of the suite, comma-separated.")] = None,
    holdout_every: Annotated[int, typer.Option(help="Every n-th task is eval only (0: eval on the training "
                                                    "tasks).")] = 3,
    substrate: o.Substrate = "process",
    iterations: Annotated[int, typer.Option(help="Updates per (treatment, seed).")] = 8,
    groups: Annotated[int, typer.Option(help="Tasks (groups) per iteration.")] = 4,
    group_size: Annotated[int, typer.Option(help="Attempts per group (G).")] = 4,
    eval_every: Annotated[int, typer.Option(help="Evaluate every n iterations.")] = 2,
    eval_episodes: Annotated[int, typer.Option(help="Eval episodes per eval task on the way.")] = 1,
    final_eval_episodes: Annotated[int, typer.Option(help="Eval episodes per eval task at the end.")] = 3,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 0.05,
    concurrency: o.Concurrency = None,
    executor: Annotated[str, typer.Option(help="local (in process) or ray (--concurrency per node).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="ray: auto or HOST:PORT to join; none: a local Ray.")] = None,
    step_timeout: o.StepTimeout = "1s",  # a frozen step waits this long
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
    report_only: Annotated[str | None, typer.Option("--report", help="Rebuild the report of this train run "
                                                                      "from the ledger in --out.")] = None,
) -> None:
    """Train a small policy through the real rollout engine, once per treatment of invalid attempts."""
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.report.tables import train_parts
    from drumsbench.rollout.attempt import RolloutConfig
    from drumsbench.train.experiment import RUN_KIND, TrainConfig, run_train
    from drumsbench.train.fault_model import FaultMode
    from drumsbench.train.rebuild import build_report
    from drumsbench.train.treatments import parse_treatments

    ledger = open_ledger(out)
    if report_only:
        if ledger.run(report_only)["kind"] != RUN_KIND:
            raise UsageError(f"--report: run {report_only} is not a train run")
        run_id = report_only
    else:
        try:
            from importlib.util import find_spec

            if find_spec("torch") is None:
                raise UsageError("drumsbench train needs torch: pip install 'drumsbench[train]'")
        except ValueError:
            pass
        if faults not in [m.value for m in FaultMode]:
            raise UsageError(f"--faults: {faults!r} is not one of {', '.join(m.value for m in FaultMode)}")
        from drumsbench.executors.ray import executor_options

        step = parse_duration(step_timeout, "--step-timeout")
        flags = {"episode_timeout_s": "--step-timeout"}  # the others' flags are --field-name
        try:
            extra: dict[str, object] = {} if concurrency is None else {"concurrency": concurrency}
            extra.update(executor_options(executor, ray_address))  # one-line errors for both flags
            cfg = TrainConfig.model_validate(dict(
                tasks=tasks, substrate=substrate, treatments=parse_treatments(treatments),
                seeds=_seeds(seeds, seed_list, seed), fault_mode=FaultMode(faults), fault_scale=fault_scale,
                holdout_every=holdout_every, integrity=_choices(integrity, ("on", "off"), "--integrity"),
                start=_choices(start, ("scratch", "fork"), "--start"), prefix_k=prefix_k, only=names(task_ids),
                iterations=iterations, groups=groups, group_size=group_size, eval_every=eval_every,
                eval_episodes=eval_episodes, final_eval_episodes=final_eval_episodes, lr=lr,
                rollout=RolloutConfig(step_timeout_s=step, episode_timeout_s=max(30.0, step * 20), max_steps=50),
                **extra))
        except ValidationError as e:
            raise usage_error(e, flags) from None
        from drumsbench.train.experiment import select_tasks

        select_tasks(cfg)
        run_id = new_run_id()
        sub = make_substrate(cfg.substrate, run_id, cfg.tasks)
        ledger.create_run(run_id, RUN_KIND, cfg.model_dump(mode="json"), machine_info(), commit())
        err.print(f"train {run_id}: {', '.join(a.label for a in cfg.arms())} x seeds {cfg.seeds}, "
                  f"{cfg.fault_mode} faults, {cfg.substrate}, ledger {ledger.path}")
        display = live(progress)
        started = time.monotonic()
        said = [-1]

        def show(p: Any) -> None:
            line = (f"{p.done}/{p.total} updates  {p.label}  attempts {p.attempts}  invalid {p.invalid}  "
                    f"{time.monotonic() - started:.0f} s")
            if display is not None:
                display.update(line)
            elif progress and p.done != said[0]:  # into a pipe: one line per update
                said[0] = p.done
                err.print(line, highlight=False)

        try:
            if display is not None:
                display.start()
            run_train(cfg, sub, ledger, run_id, show)
            ledger.set_status(run_id, "complete")
        except KeyboardInterrupt:
            ledger.set_status(run_id, "interrupted")
            err.print(f"interrupted; what ran is in the ledger (drumsbench train --report {run_id})")
            raise typer.Exit(130) from None
        finally:
            if display is not None:
                display.stop()
            sub.close()
        err.print(f"trained in {time.monotonic() - started:.0f} s")
    report = build_report(ledger, run_id)
    ledger.put_artifact(run_id, "train-summary", "report", report.model_dump(mode="json", by_alias=True))
    for part in train_parts(report):
        console.print(part, highlight=False)
    console.print(f"{report.conditions}; isolation positive control "
                  f"{'fired' if report.isolation_control_fired else 'DID NOT FIRE'}; run {run_id}")
    if json_path:
        write_json(report.model_dump(mode="json", by_alias=True), None, "", json_path)
