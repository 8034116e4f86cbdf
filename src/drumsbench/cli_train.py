"""``drumsbench train``: a GRPO-style training run per treatment of invalid attempts, side by side.

torch is imported only when this command trains (``pip install drumsbench[train]``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.live import Live
from rich.table import Table

from drumsbench.cli import app, console, err, parse_duration
from drumsbench.errors import UsageError


def _pct(e) -> str:
    if e is None or e.value is None:
        return "n/a"
    if e.low is None or e.high is None:
        return f"{e.value:.0%}"
    return f"{e.value:.0%} [{e.low:.0%}, {e.high:.0%}]"


def _pp(e) -> str:
    if e is None or e.value is None:
        return "n/a"
    if e.low is None or e.high is None:
        return f"{e.value * 100:+.0f} pp"
    return f"{e.value * 100:+.0f} pp [{e.low * 100:+.0f}, {e.high * 100:+.0f}]"


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def _seeds(seeds: int, seed_list: str | None, base: int) -> list[int]:
    if seed_list:
        try:
            out = [int(x) for x in seed_list.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--seed-list: {seed_list!r} is not a comma-separated list of whole numbers") from None
        if not out or len(set(out)) != len(out):
            raise UsageError(f"--seed-list: {seed_list!r} must name distinct seeds")
        return out
    if not 1 <= seeds <= 100:
        raise UsageError(f"--seeds: {seeds} is out of range; give 1 to 100")
    return list(range(base, base + seeds))


def _integrity(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out or any(x not in ("on", "off") for x in out) or len(set(out)) != len(out):
        raise UsageError(f"--integrity: {text!r}; give on, off or on,off")
    return out


def _start(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out or any(x not in ("scratch", "fork") for x in out) or len(set(out)) != len(out):
        raise UsageError(f"--start: {text!r}; give scratch, fork or scratch,fork")
    return out


def render(report) -> list:
    """The report as rich tables and lines (learning curves, final eval with tests, training cost)."""
    curves = Table(title=f"eval success on {len(report.eval_tasks)} clean tasks, mean of {len(report.seeds)} seeds "
                         "[95% t]")
    curves.add_column("iteration", justify="right")
    for c in report.curves:
        curves.add_column(c.treatment)
    for i, pt in enumerate(report.curves[0].points if report.curves else []):
        curves.add_row(str(pt.iteration), *(_pct(c.points[i].success) if i < len(c.points) else "n/a"
                                             for c in report.curves))

    final = Table(title="final eval; first-step policy mass")
    for col in ("treatment", "success [t]", "pooled", "P(golden)", "P(sabotage)", "P(tests)"):
        final.add_column(col)
    for f, c in zip(report.finals, report.curves, strict=True):
        last = c.points[-1] if c.points else None
        final.add_row(f.treatment, _pct(f.success), f"{f.successes}/{f.valid}",
                      f"{last.mass_golden:.2f}" if last else "n/a", f"{last.mass_sabotage:.2f}" if last else "n/a",
                      f"{last.mass_test:.2f}" if last else "n/a")

    comp = Table(title="final eval difference, paired by seed")
    for col in ("contrast", "difference [95% t]", "p sign-flip", "p Fisher"):
        comp.add_column(col)
    for c in report.comparisons:
        comp.add_row(f"{c.a} - {c.b}", _pp(c.difference), _p(c.p_paired_permutation), _p(c.p_fisher))

    cost = Table(title=f"training rollouts, {report.fault_mode} faults")
    for col in ("treatment", "attempts", "invalid", "retries", "inv. in loss", "s/valid", "USD/valid",
                "to 90%: seeds, host s"):
        cost.add_column(col)
    for c in report.costs:
        h = c.host_s_to_90
        to90 = f"{c.reached_90}/{len(report.seeds)}" + ("" if h is None or h.value is None else
                                                        f", {h.value:.0f}" + ("" if h.low is None else
                                                                             f" [{h.low:.0f}, {h.high:.0f}]"))
        cost.add_row(c.treatment, str(c.attempts), _pct(c.invalid_rate), str(c.retries), str(c.invalid_in_loss),
                     "n/a" if c.s_per_valid_rollout is None else f"{c.s_per_valid_rollout:.3f}",
                     "n/a" if c.usd_per_valid_rollout is None else f"{c.usd_per_valid_rollout:.2e}", to90)
    lines = [f"faults: {report.faults}"]
    lines += [f"{c.treatment}: invalid by cause: " + (", ".join(f"{k} {v}" for k, v in c.invalid.items()) or "none")
              for c in report.costs]
    lines += [f"{c.a} - {c.b}: {c.note}" for c in report.comparisons[:1]]
    lines.append(f"USD at {report.price.usd_per_host_hour:g} per host-hour ({report.price.name}); "
                 "s/valid = host seconds of the treatment's runs per valid training rollout")
    return [curves, final, comp, cost, *lines]


@app.command()
def train(
    treatments: Annotated[str, typer.Option(help="Treatments of invalid attempts: exclude, zero, mask, retry.")]
    = "exclude,zero,mask,retry",
    seeds: Annotated[int, typer.Option(help="Number of seeds (base, base+1, ...).")] = 5,
    seed: Annotated[int, typer.Option(help="First seed.")] = 0,
    seed_list: Annotated[str | None, typer.Option(help="Explicit seeds, e.g. 3,7,11 (overrides --seeds).")] = None,
    faults: Annotated[str, typer.Option(help="correlated (with the action/task), uniform or none.")] = "correlated",
    start: Annotated[str, typer.Option(help="How group members start: scratch, fork (forked from one prepared "
                                            "parent per group) or scratch,fork (the cost contrast).")] = "scratch",
    prefix_k: Annotated[int, typer.Option(help="Prefix actions before the policy decides (0-2: read, test).")] = 0,
    integrity: Annotated[str, typer.Option(help="Verifier integrity: on; off or on,off only for the integrity "
                                                "contrast (a forgeable verdict in training, eval always on).")]
    = "on",
    fault_scale: Annotated[float, typer.Option(help="Multiply every fault rate (0 to 10).")] = 1.0,
    tasks: Annotated[str, typer.Option(help="Coding suite (built-in name or folder).")] = "coding",
    task_ids: Annotated[str | None, typer.Option(help="Only these task ids of the suite, comma-separated.")] = None,
    holdout_every: Annotated[int, typer.Option(help="Every n-th task is eval only (0: eval on the training "
                                                    "tasks).")] = 3,
    substrate: Annotated[str, typer.Option(help="Where sandboxes run.")] = "process",
    iterations: Annotated[int, typer.Option(help="Updates per (treatment, seed).")] = 8,
    groups: Annotated[int, typer.Option(help="Tasks (groups) per iteration.")] = 4,
    group_size: Annotated[int, typer.Option(help="Attempts per group (G).")] = 4,
    eval_every: Annotated[int, typer.Option(help="Evaluate every n iterations.")] = 2,
    eval_episodes: Annotated[int, typer.Option(help="Eval episodes per eval task on the way.")] = 1,
    final_eval_episodes: Annotated[int, typer.Option(help="Eval episodes per eval task at the end.")] = 3,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 0.05,
    concurrency: Annotated[int | None, typer.Option(help="Attempts at once (default: number of cores).")] = None,
    step_timeout: Annotated[str, typer.Option(help="Per-step timeout (a frozen step waits this long).")] = "1s",
    out: Annotated[Path, typer.Option(help="Folder of the ledger.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the report here.")] = None,
    progress: Annotated[bool, typer.Option(help="Live progress display.")] = True,
    report_only: Annotated[str | None, typer.Option("--report", help="Rebuild the report of this train run "
                                                                      "from the ledger in --out.")] = None,
) -> None:
    """Train a small policy through the real rollout engine, once per treatment of invalid attempts."""
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.rollout import RolloutConfig
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
        step = parse_duration(step_timeout, "--step-timeout")
        flags = {"iterations": "--iterations", "groups": "--groups", "group_size": "--group-size",
                 "eval_every": "--eval-every", "eval_episodes": "--eval-episodes", "lr": "--lr",
                 "final_eval_episodes": "--final-eval-episodes",
                 "fault_scale": "--fault-scale", "holdout_every": "--holdout-every", "prefix_k": "--prefix-k",
                 "concurrency": "--concurrency", "episode_timeout_s": "--step-timeout",
                 "step_timeout_s": "--step-timeout"}
        try:
            extra: dict[str, object] = {} if concurrency is None else {"concurrency": concurrency}
            cfg = TrainConfig(tasks=tasks, substrate=substrate, treatments=parse_treatments(treatments),
                              seeds=_seeds(seeds, seed_list, seed), fault_mode=FaultMode(faults),
                              fault_scale=fault_scale, holdout_every=holdout_every,
                              integrity=_integrity(integrity), start=_start(start), prefix_k=prefix_k,
                              only=[t.strip() for t in (task_ids or "").split(",") if t.strip()],
                              iterations=iterations, groups=groups, group_size=group_size, eval_every=eval_every,
                              eval_episodes=eval_episodes, final_eval_episodes=final_eval_episodes, lr=lr,
                              rollout=RolloutConfig(step_timeout_s=step, episode_timeout_s=max(30.0, step * 20),
                                                    max_steps=50), **extra)  # type: ignore[arg-type]
        except ValidationError as e:
            first = e.errors()[0]
            name = str(first["loc"][-1]) if first["loc"] else "?"
            raise UsageError(f"{flags.get(name, '--' + name.replace('_', '-'))}: {first['msg']}") from None
        from drumsbench.train.experiment import select_tasks

        select_tasks(cfg)
        run_id = new_run_id()
        sub = make_substrate(cfg.substrate, run_id)
        ledger.create_run(run_id, RUN_KIND, cfg.model_dump(mode="json"), machine_info(), commit())
        err.print(f"train {run_id}: {', '.join(a.label for a in cfg.arms())} x seeds {cfg.seeds}, "
                  f"{cfg.fault_mode} faults, {cfg.substrate}, ledger {ledger.path}")
        live = Live(console=err, refresh_per_second=4, transient=True) if progress and err.is_terminal else None
        started = time.monotonic()
        said = [-1]

        def show(p) -> None:
            line = (f"{p.done}/{p.total} updates  {p.label}  attempts {p.attempts}  invalid {p.invalid}  "
                    f"{time.monotonic() - started:.0f} s")
            if live is not None:
                live.update(line)
            elif progress and p.done != said[0]:  # into a pipe: one line per update
                said[0] = p.done
                err.print(line, highlight=False)

        try:
            if live is not None:
                live.start()
            run_train(cfg, sub, ledger, run_id, show)
            ledger.set_status(run_id, "complete")
        except KeyboardInterrupt:
            ledger.set_status(run_id, "interrupted")
            err.print(f"interrupted; what ran is in the ledger (drumsbench train --report {run_id})")
            raise typer.Exit(130) from None
        finally:
            if live is not None:
                live.stop()
            sub.close()
        err.print(f"trained in {time.monotonic() - started:.0f} s")
    report = build_report(ledger, run_id)
    ledger.put_artifact(run_id, "train-summary", "report", report.model_dump(mode="json", by_alias=True))
    for part in render(report):
        console.print(part, highlight=False)
    console.print(f"{report.conditions}; isolation positive control "
                  f"{'fired' if report.isolation_control_fired else 'DID NOT FIRE'}; run {run_id}")
    if json_path:
        try:
            json_path.write_text(json.dumps(report.model_dump(mode="json", by_alias=True), indent=2))
        except OSError as e:
            raise UsageError(f"--json: cannot write {json_path} ({e.strerror})") from None
