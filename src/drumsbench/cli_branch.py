"""``drumsbench branch``: continuations from a prepared live state, judged per fork method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from drumsbench.cli import app, console, err, parse_duration
from drumsbench.errors import UsageError


def _ms(e) -> str:
    return "n/a" if e is None or e.value is None else f"{e.value * 1000:.1f} [{e.low * 1000:.1f}, {e.high * 1000:.1f}]"


def _ints(text: str, field: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{field}: {text!r} is not a comma-separated list of whole numbers, e.g. 1,5,20") from None


@app.command()
def branch(
    env: Annotated[str, typer.Option(help="Task suite (coding, desktop or a folder).")] = "coding",
    task: Annotated[str | None, typer.Option(help="Task id (default: the suite's first).")] = None,
    substrate: Annotated[str, typer.Option(help="Where sandboxes run.")] = "process",
    k: Annotated[int, typer.Option(help="Actions before the branch point.")] = 5,
    ks: Annotated[str, typer.Option(help="k values for the creation-time-against-k table.")] = "1,5,20",
    continuations: Annotated[int, typer.Option(help="Continuations per method.")] = 16,
    methods: Annotated[str, typer.Option(help="Fork methods: replay, file, snapshot, criu.")] = "replay,file",
    policy: Annotated[str, typer.Option(help="Policy that continues each continuation.")] = "noisy",
    step_timeout: Annotated[str, typer.Option(help="Per-step timeout.")] = "30s",
    out: Annotated[Path, typer.Option(help="Folder of the ledger.")] = Path("runs"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the report here.")] = None,
) -> None:
    """Prepare k steps, fork continuations with each method, check faithfulness, run them to the end."""
    from drumsbench.experiments.branch import BranchConfig, run_branch
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.machine import commit, machine_info
    from drumsbench.rollout import RolloutConfig

    step = parse_duration(step_timeout, "--step-timeout")
    try:
        cfg = BranchConfig(tasks=env, task=task, substrate=substrate, k=k, ks=_ints(ks, "--ks"),
                           continuations=continuations, methods=[m.strip() for m in methods.split(",") if m.strip()],
                           policy=policy, rollout=RolloutConfig(step_timeout_s=step, episode_timeout_s=step * 10))
    except ValidationError as e:
        first = e.errors()[0]
        raise UsageError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None
    import drumsbench.envs.desktop  # noqa: F401  (registers the desktop's ``criu`` fork method)
    from drumsbench.branching.methods import METHODS
    from drumsbench.policies.scripted import make_policy

    make_policy(cfg.policy)
    for name in cfg.methods:
        if name not in METHODS:
            raise UsageError(f"--methods: unknown fork method {name!r}; choose from {', '.join(METHODS)}")
    run_id = new_run_id()
    sub = make_substrate(substrate, run_id)
    ledger = open_ledger(out)
    ledger.create_run(run_id, "branch", cfg.model_dump(mode="json"), machine_info(), commit())
    try:
        report = run_branch(cfg, sub, ledger, run_id, say=lambda m: err.print(m))
        ledger.set_status(run_id, "complete")
    finally:
        sub.close()

    t = Table(title=f"branch from a prepared state: {report.task}, k={report.k}, {report.substrate} (95% intervals)")
    t.add_column("figure")
    for m in report.methods:
        t.add_column(m.method)
    dims = sorted({d for m in report.methods for d in m.faithful})
    rows = [
        ("creation, one at a time p50 (ms)", [_ms(m.creation_sequential["p50"]) for m in report.methods]),
        ("  p95", [_ms(m.creation_sequential["p95"]) for m in report.methods]),
        (f"creation, {cfg.continuations} at once p50 (ms)", [_ms(m.creation_parallel["p50"]) for m in report.methods]),
        ("faithful on every dimension", [m.faithful_all.fmt(".2f") for m in report.methods]),
        *((f"  faithful: {d}", [m.faithful[d].fmt(".2f") if d in m.faithful else "n/a" for m in report.methods])
          for d in dims),
        ("valid / success continuations", [f"{m.valid} / {m.success} of {m.continuations}" for m in report.methods]),
        ("invalid by cause", [", ".join(f"{c} {n}" for c, n in m.invalid.items()) or "0" for m in report.methods]),
        ("valid continuations per host-hour", [m.valid_per_host_hour.fmt(".4g") for m in report.methods]),
        (f"USD per valid continuation ({report.price.name})",
         [m.usd_per_valid_continuation.fmt(".3g") for m in report.methods]),
        *((f"creation p50 at k={kk} (ms)", [_ms(m.creation_by_k.get(str(kk))) for m in report.methods])
          for kk in cfg.ks),
    ]
    for label, cells in rows:
        t.add_row(label, *cells)
    console.print(t)
    if len(report.methods) > 1 and "replay" in [m.method for m in report.methods]:
        base = next(m for m in report.methods if m.method == "replay").creation_sequential["p50"].value or 0
        for m in report.methods:
            if m.method != "replay" and m.creation_sequential["p50"].value:
                console.print(f"replay / {m.method} creation time: {base / m.creation_sequential['p50'].value:.1f}x")
    console.print(f"prepared state unchanged afterwards: {report.prepared_unchanged}; isolation positive control "
                  f"{'fired' if report.isolation_control_fired else 'DID NOT FIRE'}; run {run_id}")
    for m in report.methods:
        for problem in m.errors[:3]:
            console.print(f"{m.method}: {problem}")
    if json_path:
        json_path.write_text(json.dumps(report.model_dump(mode="json", by_alias=True), indent=2))
