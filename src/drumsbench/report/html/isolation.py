"""The isolation experiment: escape probes per substrate and the positive control behind each verdict."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from drumsbench.report.html.cells import Keyed, Palette, Raw, table
from drumsbench.report.html.data import RunData


def sec_isolation(runs: Sequence[RunData], pal: Palette) -> str | None:
    """Escape probes per substrate: ran, contained, and the positive control behind each verdict."""
    items = [(rd, a) for rd in runs for a in rd.art.isolation.values()]
    if not items:
        return None
    rows: list[list[object]] = []
    for rd, a in items:
        for p in a.probes:
            cls = "ok" if p.verdict == "contained" else "bad" if p.verdict == "NOT contained" else "na"
            rows.append([rd.label, f"{a.substrate} ({a.declared})", p.probe,
                         Keyed(f"{rd.label}/isolation/{a.substrate}/{p.probe}",
                               Raw(f'<b class="{cls}">{escape(p.verdict)}</b>')),
                         "yes" if p.ran else "no", p.control, p.detail])
        rows.append([rd.label, f"{a.substrate} ({a.declared})", "canary positive control",
                     Keyed(f"{rd.label}/isolation/{a.substrate}/canary",
                           Raw('<b class="ok">fired</b>' if a.canary_control_fired else
                               '<b class="bad">DID NOT FIRE</b>')), "yes", "", ""])
    return ('<p class="note">"contained" needs a positive control that fired (the same probe where nothing '
            'isolates); otherwise "unconfirmed".</p>' +
            table(["run", "substrate", "probe", "verdict", "ran", "control", "detail"], rows, "small", left=7))
