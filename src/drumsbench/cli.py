"""``drumsbench``: the command line.

Every user error is one line on stderr naming the field and the fix, exit code 2, no traceback.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, cast

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table

from drumsbench import commands_sweep as cs
from drumsbench.errors import DrumsError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Run and judge the infrastructure under RL agents' rollouts.")
tasks_app = typer.Typer(no_args_is_help=True, help="Task suites.")
app.add_typer(tasks_app, name="tasks")
console = cs.console  # files and pipes get a wide console (no cut cells)
err = Console(stderr=True)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, field: str) -> float:
    """'90', '90s', '15m', '1h', '500ms' -> seconds; UsageError naming ``field`` otherwise."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", text or "")
    if not m:
        raise UsageError(f"{field}: {text!r} is not a duration; write e.g. 60s, 15m, 1h or 500ms")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise UsageError(f"{field}: {text!r} must be positive; write e.g. 60s")
    return value


@contextlib.contextmanager
def progress_lines(progress: bool) -> Iterator[Callable[[str], None]]:
    """What a long command says as it goes: on a terminal a live status line (rich) with each step
    also printed; into a pipe plain lines on stderr; nothing with ``--no-progress``."""
    if not progress:
        yield lambda _m: None
        return
    if not err.is_terminal:
        yield lambda m: err.print(m)
        return
    with err.status("starting") as status:
        def say(m: str) -> None:
            err.print(m)
            status.update(m)

        yield say


def usage_error(e: ValidationError, flags: dict[str, str] | None = None) -> UsageError:
    """A one-line usage error from a configuration model's first validation error: the field's
    flag (from ``flags``, else ``--field-name`` without a ``_s`` unit suffix) and pydantic's message."""
    first = e.errors()[0]
    name = str(first["loc"][-1]) if first["loc"] else "?"
    flag = (flags or {}).get(name) or "--" + name.removesuffix("_s").replace("_", "-")
    return UsageError(f"{flag}: {first['msg']}")


_validation = usage_error  # the name the sweep and project commands use


@app.command()
def run(
    substrate: Annotated[str, typer.Option(help="Where sandboxes run (see `drumsbench doctor`).")] = "process",
    tasks: Annotated[str, typer.Option(help="Built-in suite name or a suite folder.")] = "coding",
    policy: Annotated[str, typer.Option(help="oracle, null, noisy, explorer, endpoint or "
                                        "adversary[:NAME,...].")] = "oracle",
    noisy_p: Annotated[float, typer.Option(help="noisy: probability of the oracle's fix.")] = 0.5,
    explorer_steps: Annotated[int, typer.Option(help="explorer: exploring steps before the fix.")] = 20,
    endpoint: Annotated[str | None, typer.Option(help="endpoint: OpenAI-compatible base URL, e.g. "
                                                 "http://127.0.0.1:8001/v1.")] = None,
    model: Annotated[str | None, typer.Option(help="endpoint: the model name the endpoint serves.")] = None,
    think_time: Annotated[str, typer.Option(help="Pause before each action, standing for inference.")] = "0s",
    concurrency: Annotated[int | None, typer.Option(help="Attempts at once (default: number of cores).")] = None,
    duration: Annotated[str, typer.Option(help="How long to run, e.g. 60s, 15m.")] = "30s",
    attempts: Annotated[int | None, typer.Option(help="Stop after this many attempts.")] = None,
    inject: Annotated[str, typer.Option(help="Faults: cause=rate,... e.g. stale_generation=0.05.")] = "",
    step_timeout: Annotated[str, typer.Option(help="Per-step timeout.")] = "30s",
    episode_timeout: Annotated[str, typer.Option(help="Per-episode timeout.")] = "300s",
    verify_timeout: Annotated[str, typer.Option(help="Verifier time limit (default: each task's own).")] = "task",
    reset: Annotated[str, typer.Option(help="auto, in_place or recreate.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for policies and fault draws.")] = 0,
    usd_per_host_hour: Annotated[float | None, typer.Option(help="Host price for the headline.")] = None,
    price: cs.PriceOpt = None,
    out: Annotated[Path, typer.Option(help="Folder of the ledger and reports.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this run id from the ledger in --out.")] = None,
    progress: Annotated[bool, typer.Option(help="Live progress display.")] = True,
    executor: Annotated[str, typer.Option(help="local (in process) or ray (--concurrency per node).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="ray: auto or HOST:PORT to join; none: a local Ray.")] = None,
) -> None:
    """Run attempts and print the report."""
    from drumsbench.experiments.run import RunConfig, execute, new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.measure.cost import HostPrice
    from drumsbench.rollout import RolloutConfig
    from drumsbench.substrates.base import ResetStrategy

    ledger = open_ledger(out)
    if resume:
        meta = ledger.run(resume)
        if meta["status"] == "complete":
            raise UsageError(f"--resume: run {resume} is already complete; `drumsbench report {resume}` shows it")
        cfg = RunConfig.model_validate(meta["config"])
        run_id = resume
    else:
        flags = {"concurrency": "--concurrency", "noisy_p": "--noisy-p", "explorer_steps": "--explorer-steps",
                 "max_attempts": "--attempts", "usd_per_host_hour": "--usd-per-host-hour",
                 "think_time_s": "--think-time", "step_timeout_s": "--step-timeout",
                 "episode_timeout_s": "--episode-timeout", "duration_s": "--duration",
                 "verify_timeout_s": "--verify-timeout"}
        from drumsbench.policies.endpoint import policy_name

        policy = policy_name(policy, endpoint, model)  # --policy endpoint --endpoint URL --model NAME
        if reset not in ("auto", "in_place", "recreate"):
            raise UsageError(f"--reset: {reset!r} is not one of auto, in_place, recreate")
        try:
            rollout = RolloutConfig(
                step_timeout_s=parse_duration(step_timeout, "--step-timeout"),
                episode_timeout_s=parse_duration(episode_timeout, "--episode-timeout"),
                think_time_s=0.0 if think_time.strip() in ("0", "0s") else parse_duration(think_time, "--think-time"),
                reset=None if reset == "auto" else ResetStrategy(reset),
                verify_timeout_s=None if verify_timeout == "task" else
                parse_duration(verify_timeout, "--verify-timeout"))
            extra: dict[str, object] = {}
            if concurrency is not None:
                extra["concurrency"] = concurrency
            if price:
                extra["price"] = cs.run_price(price)
            if executor not in ("local", "ray"):
                raise UsageError(f"--executor: {executor!r} is not one of local, ray")
            if ray_address is not None and executor != "ray":
                raise UsageError("--ray-address: only with --executor ray")
            if executor == "ray":
                from drumsbench.executors.ray import check_address
                from drumsbench.executors.ray import missing as ray_missing

                if ray_missing():
                    raise UsageError(f"--executor ray: {ray_missing()}")
                check_address(ray_address)
                extra["executor"] = executor
                extra["ray_address"] = ray_address
            if usd_per_host_hour is not None:
                extra["price"] = HostPrice(name="given", usd_per_host_hour=usd_per_host_hour,
                                           note="given with --usd-per-host-hour")
            cfg = RunConfig(substrate=substrate, tasks=tasks, policy=policy, noisy_p=noisy_p,
                            explorer_steps=explorer_steps, duration_s=parse_duration(duration, "--duration"),
                            max_attempts=attempts, inject=inject, seed=seed, rollout=rollout, **extra)
        except ValidationError as e:
            raise _validation(e, flags) from None
        run_id = new_run_id()
        # Validate everything that can be wrong before the ledger records a run.
        from drumsbench.envs import suites
        from drumsbench.experiments.run import make_substrate
        from drumsbench.faults import FaultPlan
        from drumsbench.policies.scripted import make_policy

        FaultPlan.parse(cfg.inject)
        make_policy(cfg.policy, cfg.noisy_p, cfg.explorer_steps)
        suites.load(cfg.tasks)
        make_substrate(cfg.substrate, run_id, cfg.tasks)
        ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), machine_info(), commit())
        cs.remember_prices(ledger, run_id, price)

    err.print(f"run {run_id}: {cfg.substrate}, {cfg.tasks}, policy {cfg.policy}, concurrency {cfg.concurrency}, "
              f"ledger {ledger.path}")
    live = Live(console=err, refresh_per_second=4, transient=True) if progress and err.is_terminal else None

    def show(p) -> None:
        import time

        elapsed = time.monotonic() - p.started
        done = sum(p.counts[k] for k in ("success", "failed", "invalid"))
        t = Table.grid(padding=(0, 2))
        t.add_row(f"elapsed {elapsed:5.1f} s", f"attempts {done}", f"rate {done / max(elapsed, 1e-9):.1f}/s",
                  f"success {p.counts['success']}", f"failed {p.counts['failed']}", f"invalid {p.counts['invalid']}")
        if live is not None:
            live.update(t)

    if live is not None:
        live.start()
    try:
        status, _ = execute(ledger, run_id, cfg, resume=bool(resume), on_progress=show if live else None)
    finally:
        if live is not None:
            live.stop()
    _report(ledger, run_id, out, json_path, price, publish=True)
    if status == "interrupted":
        err.print(f"interrupted: continue with `drumsbench run --resume {run_id} --out {out}`")
        raise typer.Exit(130)


def _report(ledger, run_id: str, out: Path, json_path: Path | None, price: list[Path] | None = None,
            publish: bool = False):
    """Print the run's report and write its JSON (``out/RUN/report.json`` and ``--json``).

    ``publish``: also store the derived price figures in the ledger (the producing command does,
    right after its run); ``drumsbench report`` never writes to the ledger."""
    from drumsbench.measure.summary import build
    from drumsbench.report.terminal import print_report

    cs.load_price_files(price)  # a bad price file is a usage error before anything else
    if cs.special_report(ledger, run_id, out, json_path, price):  # sweep, project, branch, coldstart, isolation
        return None
    report = build(ledger, run_id)
    print_report(report, console)
    if report.kind == "serve":  # served traffic: who drove the attempts
        from drumsbench.serve.clients import print_clients

        print_clients(ledger, run_id, console)
    data = cs.run_costs(ledger, run_id, report, price, report.dump(), publish=publish)
    cs.write_json(data, out / run_id, "report.json", json_path)
    return report


@app.command()
def report(
    run_ids: Annotated[list[str], typer.Argument(help="Run id(s) (see the ledger); with --html, side by side.")],
    out: Annotated[Path, typer.Option(help="Folder of the ledger.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Also write one offline HTML report here.")] = None,
    price: cs.PriceOpt = None,
) -> None:
    """Rebuild runs' reports from the ledger alone."""
    from drumsbench.experiments.run import ledger_path
    from drumsbench.ledger import Ledger

    if not ledger_path(out).exists():
        raise UsageError(f"--out: no ledger at {ledger_path(out)}; give the folder a run wrote to")
    if json_path is not None and len(run_ids) > 1:
        raise UsageError("--json: the JSON report is one run's; give one run id, or use --html for several")
    ledger = Ledger(ledger_path(out))
    for run_id in run_ids:
        ledger.run(run_id)  # every id known before anything is printed
    reports = {run_id: _report(ledger, run_id, out, json_path, price) for run_id in run_ids}
    if html_path is not None:
        from drumsbench.report.html import write_html

        write_html(ledger, run_ids, html_path, reports, price_files=cs.load_price_files(price))
        err.print(f"html report: {html_path}")


@app.command()
def gc() -> None:
    """Remove what crashed runs left behind: sandboxes, containers, mounts, processes."""
    from drumsbench import state
    from drumsbench.substrates import registry

    dead = state.dead_runs()
    ids = {e["run_id"] for e in dead}
    removed: list[str] = []
    for name in registry.names():
        try:
            cls = registry.get(name)
        except Exception as e:
            err.print(f"gc: cannot load substrate {name}: {e}")
            continue
        if cls.missing() is None:
            removed += cls.gc(state.state_dir(), ids)
    for run_id in ids:
        state.unregister(run_id)
    console.print(f"gc: {len(ids)} dead run(s); removed {len(removed)} thing(s)")
    for line in removed:
        console.print(f"  {line}")


@app.command()
def doctor() -> None:
    """Which substrates are ready here, and what to install for the others."""
    from drumsbench.substrates import registry

    t = Table(title="substrates")
    for col in ("substrate", "status", "isolation", "reset", "what to do"):
        t.add_column(col)
    for name in registry.names():
        try:
            cls = registry.get(name)
            missing = cls.missing()
            caps = cls.capabilities
            t.add_row(name, "ready" if missing is None else "missing", caps.isolation.value,
                      ",".join(r.value for r in caps.reset_strategies), missing or "")
        except Exception as e:
            t.add_row(name, "broken", "", "", str(e))
    console.print(t)
    from drumsbench import criu

    console.print(f"CRIU (live fork): {criu.describe()}")


@app.command()
def conformance(substrate: Annotated[str, typer.Option(help="Substrate to check.")] = "process") -> None:
    """Run the substrate conformance suite against a substrate."""
    from drumsbench import state
    from drumsbench.experiments.run import make_substrate, new_run_id
    from drumsbench.substrates.conformance import run_all

    results = run_all(lambda: make_substrate(substrate, new_run_id()))
    for name, failure in results:
        console.print(f"{'PASS' if failure is None else 'FAIL'} {name}" + (f": {failure}" if failure else ""))
    failed = sum(1 for _, f in results if f)
    console.print(f"{len(results) - failed} passed, {failed} failed")
    del state
    if failed:
        raise typer.Exit(1)


@tasks_app.command("list")
def tasks_list(suite: Annotated[str, typer.Argument(help="Suite name or folder.")] = "coding") -> None:
    """List a suite's tasks."""
    from drumsbench.envs import suites

    for t in suites.load(suite).tasks:
        console.print(f"{t.id:36} {t.description.splitlines()[0][:80]}")


@tasks_app.command("fingerprint")
def tasks_fingerprint(suite: Annotated[str, typer.Argument(help="Suite name or folder.")] = "coding") -> None:
    """Print every task's start fingerprint (to update task.toml)."""
    from drumsbench.envs.suites import fingerprints

    for task_id, fp in fingerprints(suite).items():
        console.print(f"{task_id} {fp}")


@tasks_app.command("check")
def tasks_check(
    suite: Annotated[str, typer.Argument(help="Suite name or folder (any environment kind).")] = "coding",
    substrates: Annotated[str, typer.Option(help="Comma-separated substrates to check on.")] = "process",
    task: Annotated[str | None, typer.Option(help="Task for the environment checker (default: the first).")] = None,
) -> None:
    """The environment checker on each substrate (reset and fingerprint, stale actions refused, capture
    round trip, oracle succeeds and null fails, broken observation and verifier classified), then the
    kind's own task checks (coding: every task fails at its start and passes with its golden patch on
    each substrate's image). Exit 1 on a problem."""
    import tempfile

    from drumsbench.envs import suites
    from drumsbench.experiments.envcheck import check_environment
    from drumsbench.experiments.taskcheck import TaskCheck
    from drumsbench.plugins import load_spec
    from drumsbench.substrates import registry

    kind = suites.KINDS.load(suites.suite_kind(suite))
    loaded = suites.load(suite)
    names = [n.strip() for n in substrates.split(",") if n.strip()]
    for n in names:
        missing = registry.get(n).missing()
        if missing:
            raise UsageError(f"--substrates: {n} is not usable here: {missing}")
    chosen = next((t for t in loaded.tasks if t.id == task), None) if task else loaded.tasks[0]
    if chosen is None:
        raise UsageError(f"--task: no task {task!r} in {suite}; `drumsbench tasks list {suite}` shows them")

    def show(c: TaskCheck) -> None:
        what = "data checks" if c.substrate == "host" else "fails on the start state, passes with the golden patch"
        if c.ok:
            console.print(f"ok   {c.substrate:8} {c.task}: {what}", highlight=False)
        else:
            console.print(f"FAIL {c.substrate:8} {c.task}: {c.problem}", highlight=False)

    failures = total = 0
    with tempfile.TemporaryDirectory(prefix="drumsbench-taskcheck-") as tmp:
        for n in names:
            sub = registry.get(n)(f"envcheck-{n}", Path(tmp) / "state")
            try:
                for c in check_environment(loaded.make_env, chosen, sub):
                    total += 1
                    failures += not c.ok
                    console.print(f"{'ok  ' if c.ok else 'FAIL'} {n:8} env {c.check}: {c.detail}", highlight=False)
            finally:
                sub.close()
        if kind.task_checks is not None:
            task_checks = cast(Callable[..., list[TaskCheck]], load_spec(kind.task_checks))
            results = task_checks(suite, names, Path(tmp), progress=show)
            total += len(results)
            failures += sum(not c.ok for c in results)
    console.print(f"{total - failures} of {total} checks passed ({kind.name} environment, {', '.join(names)})")
    if failures:
        raise typer.Exit(1)


cs.register(app)


def main() -> None:
    import drumsbench.cli_branch
    import drumsbench.cli_serve
    import drumsbench.cli_substrates
    import drumsbench.cli_train  # noqa: F401 - registers train

    try:
        app()
    except DrumsError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

