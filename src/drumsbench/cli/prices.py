"""``--price FILE`` on run, report and sweep: loading, remembering and showing a run's prices."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from drumsbench.cli.common import console
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import WHOLE_RUN, stored_price_files

if TYPE_CHECKING:
    from drumsbench.ledger import Ledger
    from drumsbench.measure.cost import HostPrice, PriceFile


def load_price_files(paths: list[Path] | None) -> list[PriceFile]:
    from drumsbench.measure.cost import load_prices

    return [load_prices(p) for p in paths or []]


def run_price(paths: list[Path] | None) -> HostPrice | None:
    """The first priced host of ``--price`` files, for the run's own headline; validates the files."""
    files = load_price_files(paths)
    return files[0].hosts()[0] if files else None


def remember_prices(ledger: Ledger, run_id: str, paths: list[Path] | None) -> None:
    """Keep the run's price files in its ledger, so ``report`` shows them without ``--price``."""
    files = load_price_files(paths)
    if files:
        artifacts.put(ledger, run_id, "files", artifacts.PriceFilesArtifact(files=files))


def run_costs(ledger: Ledger, run_id: str, report: Any, paths: list[Path] | None,
              data: dict[str, Any], publish: bool = False) -> dict[str, Any]:
    """Print host figures and attribution for a plain run; returns ``data`` with a ``costs`` section.

    The figures are over the whole run (not a confirmed window) and say so; ``publish`` stores them."""
    from rich.console import Group

    from drumsbench.experiments.sweep import publish_prices
    from drumsbench.measure.cost import attribute, host_figures, pool_use
    from drumsbench.measure.windows import usage
    from drumsbench.report.sweep import cost_group

    files = load_price_files(paths)
    if not files:
        files = stored_price_files(ledger, run_id)
    if not files:
        return data
    hosts = [h for f in files for h in f.hosts()]
    figures = host_figures(hosts, report.valid_per_host_hour, report.host_seconds / 3600)
    if publish:
        publish_prices(ledger, run_id, figures, basis=WHOLE_RUN)
    use = usage(ledger, run_id)
    pool = pool_use(ledger, run_id)  # the warm pool the run held, priced in the idle reserve line
    attributions = [attribute(h, f.attribution, use, scope="the whole run", pool=pool)
                    for f in files for h in f.hosts()]
    console.print(Group(*cost_group(figures, attributions, f"inference: {report.inference_cost}")))
    data["costs"] = {"basis": WHOLE_RUN, "prices": [f.model_dump(mode="json") for f in figures],
                     "attribution": [a.model_dump(mode="json") for a in attributions]}
    return data
