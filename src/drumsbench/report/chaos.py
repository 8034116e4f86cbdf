"""A chaos run's verdict in the terminal: one line of totals, one per check, then passed or FAILED."""

from __future__ import annotations

from rich.console import Console

from drumsbench.measure.artifacts import ChaosSummaryArtifact


def print_chaos(run_id: str, summary: ChaosSummaryArtifact, console: Console) -> None:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(summary.by_kind.items()))
    console.print(f"chaos {run_id}: {summary.events} events ({kinds or 'none'}), {summary.attempts} attempts, "
                  f"{summary.harness_starts} harness start(s)", soft_wrap=True, highlight=False)
    for name, c in summary.checks.items():
        console.print(f"  {'ok  ' if c.passed else 'FAIL'} {name}: {c.detail}", soft_wrap=True, highlight=False)
    console.print(f"chaos: {'passed' if summary.passed else 'FAILED'}")
