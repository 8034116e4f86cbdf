"""``drumsbench coldstart``: substrates side by side, each beside its raw floor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, finishing, progress_lines, substrate_names, usage_error, write_json

if TYPE_CHECKING:
    from drumsbench.measure.artifacts import ColdstartArtifact
    from drumsbench.measure.pool import PoolColdstartArtifact


def coldstart_json(run_id: str, config: dict[str, Any], results: Sequence[ColdstartArtifact],
                   pools: Sequence[PoolColdstartArtifact] = ()) -> dict[str, Any]:
    """``coldstart.json``; ``pools``: the warm pool per substrate (``pool``, absent without one)."""
    return {"schema": "drumsbench.coldstart/2", "run_id": run_id, "config": config,
            "results": [r.model_dump(mode="json") for r in results],
            **({"pool": [p.model_dump(mode="json") for p in pools]} if pools else {})}


def coldstart(
    substrate: o.Substrates = None,
    substrates: o.SubstratesAlias = None,
    mode: Annotated[str, typer.Option(help="sequential, staggered or burst.")] = "sequential",
    n: Annotated[int, typer.Option("-n", help="Sandboxes per substrate.")] = 100,
    stagger: Annotated[float, typer.Option(help="staggered: seconds between starts.")] = 0.05,
    idle: Annotated[int, typer.Option(help="Idle sandboxes for the memory figure.")] = 8,
    reset_n: Annotated[int, typer.Option(help="Resets per strategy.")] = 10,
    pool: Annotated[str, typer.Option("--pool", metavar="auto|off|N", help=(
        "Also measure acquire from a warm pool of this many sandboxes (auto: one per core; off: not "
        "measured)."))] = "auto",
    out: o.Out = o.RUNS,
    json_path: o.Json = None,
    progress: o.Progress = True,
) -> None:
    """Cold start, teardown, idle memory and reset per substrate, beside each one's raw floor."""
    from drumsbench.core import host_state as state
    from drumsbench.core.machine import commit, machine_info
    from drumsbench.envs.coding.task import load_suite
    from drumsbench.experiments.coldstart import ColdstartConfig, measure, measure_pool
    from drumsbench.experiments.run import make_substrate, new_run_id, open_ledger
    from drumsbench.measure import artifacts
    from drumsbench.report.tables import coldstart_group
    from drumsbench.rollout.pool import parse_pool

    chosen = substrate_names(substrate, substrates)
    try:
        cfg = ColdstartConfig(substrates=chosen, mode=mode, n=n, stagger_s=stagger, idle=idle, reset_n=reset_n,
                              pool=parse_pool(pool))
    except ValidationError as e:
        raise usage_error(e, {"stagger_s": "--stagger", "substrates": "--substrate", "n": "-n"}) from None
    run_id = new_run_id()
    subs = [make_substrate(name, run_id) for name in chosen]
    ledger = open_ledger(out)
    ledger.create_run(run_id, "coldstart", cfg.model_dump(mode="json"), machine_info(), commit())
    files = load_suite("coding")[0].files
    results = []
    pools: list[PoolColdstartArtifact] = []
    state.register(run_id, chosen)  # a crash leaves sandboxes (pooled ones too) that gc can find
    try:
        with finishing(ledger, run_id, subs), progress_lines(progress) as say:
            for sub in subs:
                r = measure(sub, cfg, files, say=say)
                artifacts.put(ledger, run_id, sub.name, r)
                results.append(r)
                if cfg.pool_size():
                    p = measure_pool(sub, cfg, say=say)
                    artifacts.put(ledger, run_id, sub.name, p)
                    pools.append(p)
                sub.close()
    finally:
        state.unregister(run_id)
    console.print(coldstart_group(results, cfg.mode, cfg.n, cfg.idle, run_id, pools))
    write_json(coldstart_json(run_id, cfg.model_dump(mode="json"), results, pools), out / run_id, "coldstart.json",
               json_path)
