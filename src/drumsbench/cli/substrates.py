"""``drumsbench doctor`` and ``drumsbench conformance``: which substrates are ready, and whether one keeps
the substrate contract."""

from __future__ import annotations

import typer

from drumsbench.cli import options as o
from drumsbench.cli.common import console


def doctor() -> None:
    """Which substrates are ready here, and what to install for the others."""
    from drumsbench.branching import criu_binary as criu
    from drumsbench.report.tables import doctor_table
    from drumsbench.substrates import registry

    rows: list[tuple[str, str, str, str, str]] = []
    for name in registry.names():
        try:
            cls = registry.get(name)
            missing = cls.missing()
            caps = cls.capabilities
            rows.append((name, "ready" if missing is None else "missing", caps.isolation.value,
                         ",".join(r.value for r in caps.reset_strategies), missing or ""))
        except Exception as e:
            rows.append((name, "broken", "", "", str(e)))
    console.print(doctor_table(rows))
    console.print(f"CRIU (live fork): {criu.describe()}")


def conformance(substrate: o.Substrate = "process") -> None:
    """Run the substrate conformance suite against a substrate."""
    from drumsbench.experiments.run import make_substrate, new_run_id
    from drumsbench.substrates.conformance import run_all

    results = run_all(lambda: make_substrate(substrate, new_run_id()))
    for name, failure in results:
        console.print(f"{'PASS' if failure is None else 'FAIL'} {name}" + (f": {failure}" if failure else ""))
    failed = sum(1 for _, f in results if f)
    console.print(f"{len(results) - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)
