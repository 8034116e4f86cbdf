"""The options the commands share: one name, one type and one help text for the same thing everywhere.

Use as ``out: Out = RUNS``. A command that takes several substrates has ``--substrate`` repeatable
and comma-separated (``Substrates``, with the older ``--substrates`` kept as a hidden alias); one that
takes one substrate has ``Substrate``; every task suite is ``--tasks``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RUNS = Path("runs")

# -- where things go ------------------------------------------------------------------------------
Out = Annotated[Path, typer.Option("--out", help="Folder of the ledger and reports.")]
Json = Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")]
Progress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress as it goes.")]
Price = Annotated[list[Path] | None, typer.Option(
    "--price", help="Price file (TOML or JSON: [owned], [cloud], [cloud_eur], [attribution]); repeatable. "
                    "See examples/prices/.")]

# -- what runs where -------------------------------------------------------------------------------
Substrate = Annotated[str, typer.Option("--substrate", help="Where sandboxes run (see `drumsbench doctor`).")]
Substrates = Annotated[list[str] | None, typer.Option(
    "--substrate", metavar="NAME[,NAME...]",
    help="Substrates: repeatable and/or comma-separated, e.g. --substrate process,docker (default: process).")]
SubstratesAlias = Annotated[list[str] | None, typer.Option("--substrates", hidden=True, metavar="NAME[,NAME...]",
                                                           help="The older name of --substrate.")]
Tasks = Annotated[str, typer.Option("--tasks", help="Task suite: a built-in name (coding, desktop) or a suite "
                                                    "folder.")]
EnvAlias = Annotated[str | None, typer.Option("--env", hidden=True, help="The older name of --tasks.")]
Task = Annotated[str | None, typer.Option("--task", help="Task id (default: the suite's first).")]
Policy = Annotated[str, typer.Option("--policy", help="oracle, null, noisy, explorer, endpoint or "
                                                      "adversary[:NAME,...].")]
NoisyP = Annotated[float, typer.Option("--noisy-p", help="noisy: probability of the oracle's fix.")]
ExplorerSteps = Annotated[int, typer.Option("--explorer-steps", help="explorer: exploring steps before the fix.")]
Inject = Annotated[str, typer.Option("--inject", help="Faults: cause=rate,... e.g. stale_generation=0.05.")]

# -- how much and how long -------------------------------------------------------------------------
Concurrency = Annotated[int | None, typer.Option("--concurrency",
                                                 help="Attempts at once (default: number of cores).")]
Duration = Annotated[str, typer.Option("--duration", help="How long to run, e.g. 60s, 15m.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for policies, fault draws and bootstrap.")]
ThinkTime = Annotated[str, typer.Option("--think-time", help="Pause before each action, standing for inference.")]
StepTimeout = Annotated[str, typer.Option("--step-timeout", help="Per-step timeout.")]
EpisodeTimeout = Annotated[str, typer.Option("--episode-timeout", help="Per-episode timeout.")]
VerifyTimeout = Annotated[str, typer.Option("--verify-timeout",
                                            help="Verifier time limit (default: each task's own).")]
Reset = Annotated[str, typer.Option("--reset", help="auto, in_place, recreate or restore (desktop: a checkpoint "
                                                    "of the verified start).")]
Verifier = Annotated[str | None, typer.Option("--verifier", metavar="kept|warm|cold", help=(
    "How the coding verifier runs: kept (a server kept in the sandbox; warm where the substrate keeps "
    "none), warm or cold (docs/warm-verifier.md). Default: $DRUMSBENCH_VERIFIER, else kept. Every "
    "attempt records which one decided it."))]


def use_verifier(value: str | None) -> None:
    """``--verifier``: checked (``UsageError`` naming the flag), then made the process-wide choice
    (``DRUMSBENCH_VERIFIER``), which every coding environment of this command and its local workers
    reads."""
    if value is None:
        return
    import os

    from drumsbench.envs.coding.env import VERIFIER_VAR, VERIFIERS

    if value not in VERIFIERS:
        from drumsbench.core.errors import UsageError

        raise UsageError(f"--verifier: {value!r} is not one of {', '.join(VERIFIERS)}")
    os.environ[VERIFIER_VAR] = value


Pool = Annotated[str, typer.Option("--pool", metavar="auto|off|N", help=(
    "Warm pool: idle sandboxes made ahead of demand, checked clean and handed out: auto (one per concurrent "
    "attempt), off, or a number (see docs/pool.md)."))]
