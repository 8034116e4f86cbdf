"""The page: its frame (head, CSS, navigation, headline) around the sections, each rendered on its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import NamedTuple

from drumsbench.core.errors import UsageError
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts as A
from drumsbench.measure.cost import PriceFile
from drumsbench.measure.summary import RunReport
from drumsbench.measure.train_report import TrainReport
from drumsbench.report.html.branch import sec_branch
from drumsbench.report.html.cells import Palette
from drumsbench.report.html.chaos import sec_chaos
from drumsbench.report.html.coldstart import sec_coldstart, sec_desktop_coldstart, sec_latency
from drumsbench.report.html.costs import sec_cost
from drumsbench.report.html.data import RunData, load_run_data
from drumsbench.report.html.isolation import sec_isolation
from drumsbench.report.html.projection import sec_projection
from drumsbench.report.html.run import sec_conditions, sec_controls, sec_headline, sec_outcomes, sec_tasks
from drumsbench.report.html.screenshots import sec_screenshots
from drumsbench.report.html.sweep import sec_sweep
from drumsbench.report.html.training import sec_training


class Section(NamedTuple):
    """One section of the page: its anchor id, title, renderer (None: nothing to show) and the
    artifact kinds it shows (an unreadable one is reported in its place)."""

    sid: str
    title: str
    render: Callable[[], str | None]
    kinds: tuple[str, ...] = ()


CSS = """
:root{--fg:#1d232b;--mut:#5b6673;--line:#d8dde3;--bg:#fff;--soft:#f4f6f8;--ok:#1a7f37;--bad:#b42318}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{padding:18px 28px 10px;border-bottom:1px solid var(--line);background:var(--soft)}
h1{margin:0 0 4px;font-size:22px}
h2{font-size:18px;margin:30px 0 10px;padding-top:6px;border-top:2px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px} h4{font-size:13px;margin:12px 0 6px;color:var(--mut)}
main{padding:6px 28px 40px;max-width:1700px}
nav a{margin-right:12px;color:#1f5fbf;text-decoration:none;font-size:13px}
.meta{color:var(--mut);font-size:12.5px}
.cards{display:flex;flex-wrap:wrap;gap:14px;margin-top:14px}
.card{border:1px solid var(--line);border-top:5px solid #888;border-radius:6px;padding:10px 14px;min-width:300px;
flex:1 1 300px;max-width:560px;background:#fff}
.card .rid{font-weight:700;font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.card .sub,.card .lbl{color:var(--mut);font-size:12px}
.card .big{font-size:24px;font-weight:700;margin-top:6px}
.card .big .ci{display:block;font-size:13px;font-weight:600} .card .mid{font-size:17px;font-weight:600;margin-top:6px}
.ctl{margin-top:8px;font-weight:600}
.ok{color:var(--ok)} .bad{color:var(--bad)}
.ci{color:var(--mut);font-size:.9em} .na{color:var(--mut)} .note{color:var(--mut);font-size:12px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 10px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}
table.num td:not(.l),table.num th.r{text-align:right;font-variant-numeric:tabular-nums}
td.wrap{max-width:340px}
table.small{font-size:12px}
tr.tot td{font-weight:600} tr.cause td:first-child{padding-left:26px}
tr.dim td{color:#7a828c} tr.diff td{background:#fff7e0}
table.kv td:first-child{font-family:ui-monospace,"DejaVu Sans Mono",monospace;color:var(--mut)}
.plots{display:flex;flex-wrap:wrap;gap:16px;margin:8px 0}
.pl{flex:0 1 auto;max-width:100%} .pl .cap{font-size:12.5px;font-weight:600;margin:0 0 2px 8px;color:#333}
svg.plot{max-width:100%;height:auto;font-family:inherit}
svg.plot .bg{fill:#fff} svg.plot .area{fill:#fbfcfd;stroke:none}
svg.plot .grid{stroke:#e6e9ed;stroke-width:1} svg.plot .ax{stroke:#7a828c;stroke-width:1}
svg.plot text{font-size:11px;fill:#333} svg.plot .al{font-size:11.5px;fill:#222}
svg.plot .ln{fill:none;stroke-width:2} svg.plot .eb{fill:none;stroke-width:1.4}
svg.plot .mk{stroke-width:1.6} svg.plot .rule{stroke-dasharray:6 4;stroke-width:1.4}
svg.plot .box{fill-opacity:.35;stroke-width:1.2} svg.plot .lg{font-size:11px}
.shots{display:flex;flex-wrap:wrap;gap:12px}
figure.shot{margin:0;border:1px solid var(--line);padding:6px;background:var(--soft)}
figure.shot img{display:block;width:100%;image-rendering:auto}
figure.shot figcaption{font-size:12px;color:var(--mut);margin-top:4px}
figure.missing div{width:200px;height:120px;display:flex;align-items:center;justify-content:center;color:var(--mut)}
p.err{border:1px solid var(--bad);color:var(--bad);padding:8px;background:#fff4f2}
"""


def sections(runs: list[RunData], pal: Palette, base: Path) -> list[Section]:
    """Every section of the page, in order, each registered once here: its id, title, renderer and
    the artifact kinds it shows (``measure/artifacts.LOADED`` registers how they are read)."""
    return [
        Section("outcomes", "Outcomes", lambda: sec_outcomes(runs, pal)),
        Section("cost", "Throughput and USD per valid rollout", lambda: sec_cost(runs, pal),
                (A.PriceArtifact.KIND, A.PriceFilesArtifact.KIND)),
        Section("latency", "Cold start and phase latency per substrate", lambda: sec_latency(runs, pal)),
        Section("coldstart", "Cold-start experiment: floors, teardown, memory, reset", lambda: sec_coldstart(runs, pal),
                (A.ColdstartArtifact.KIND,)),
        Section("desktop-coldstart", "Desktop cold start per substrate: first good screenshot, reset",
                lambda: sec_desktop_coldstart(runs, pal), (A.DesktopColdstartArtifact.KIND,)),
        Section("isolation", "Isolation: escape attempts", lambda: sec_isolation(runs, pal),
                (A.IsolationArtifact.KIND,)),
        Section("sweep", "Sweep: windows, N_max and soak", lambda: sec_sweep(runs, pal),
                (A.WindowArtifact.KIND, A.SweepSummaryArtifact.KIND, A.SegmentArtifact.KIND)),
        Section("branch", "Branch from a prepared state", lambda: sec_branch(runs, pal),
                (A.BranchMethodArtifact.KIND, A.BranchSummaryArtifact.KIND)),
        Section("chaos", "Chaos: events from outside the harness", lambda: sec_chaos(runs, pal),
                (A.ChaosEventArtifact.KIND, A.ChaosSummaryArtifact.KIND)),
        Section("projection", "Worker-hour projection", lambda: sec_projection(runs, pal),
                (A.ProjectionArtifact.KIND,)),
        Section("training", "Training: does the handling of invalid attempts change what a policy learns?",
                lambda: sec_training(runs, pal), (TrainReport.KIND,)),
        Section("screenshots", "Screenshots from the desktop environment and its branches",
                lambda: sec_screenshots(runs, pal, base), (A.ScreenshotArtifact.KIND,)),
        Section("tasks", "Per task", lambda: sec_tasks(runs, pal)),
        Section("controls", "Positive controls", lambda: sec_controls(runs, pal)),
        Section("conditions", "Machine, commit, configuration, price inputs", lambda: sec_conditions(runs, pal)),
    ]


def build_html(ledger: Ledger, run_ids: Sequence[str], reports: dict[str, RunReport] | None = None,
               screenshots_base: Path | None = None, price_files: Sequence[PriceFile] = ()) -> str:
    """The page for ``run_ids`` (side by side, in the order given). Reads the ledger, never writes it;
    ``price_files`` (``report --price``) price every run instead of the prices it stored."""
    if not run_ids:
        raise UsageError("report: give at least one run id")
    base = screenshots_base if screenshots_base is not None else ledger.path.parent
    runs = [load_run_data(ledger, rid, i, (reports or {}).get(rid), price_files)
            for i, rid in enumerate(dict.fromkeys(run_ids))]
    pal = Palette()
    for rd in runs:
        pal(rd.label)
    body, nav = [], []
    for sid, title, fn, kinds in sections(runs, pal, base):
        try:
            html = fn()
        except Exception as e:  # one broken section must not cost the rest of the report
            html = (f'<p class="err">This section could not be rendered: {escape(type(e).__name__)}: '
                    f'{escape(str(e))}</p>')
        broken = [f"{rd.label}: {why}" for rd in runs for kind, why in rd.art.errors.items()
                  if kind in kinds]
        if broken:  # artifacts that do not fit their model: said in place, the rest of the section stays
            html = "".join(f'<p class="err">Part of this section could not be rendered: {escape(b)}</p>'
                           for b in broken) + (html or "")
        if html is None:
            continue
        nav.append(f'<a href="#{sid}">{escape(title)}</a>')
        body.append(f'<section id="{sid}"><h2>{escape(title)}</h2>{html}</section>')
    try:
        headline = sec_headline(runs, pal)
    except Exception as e:
        headline = f'<p class="err">Headline could not be rendered: {escape(type(e).__name__)}: {escape(str(e))}</p>'
    title = "DrumsBench report — " + ", ".join(rd.label for rd in runs)
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        # the page may load nothing from anywhere: images only as data: URIs, styles inline, no scripts
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>DrumsBench report</h1><div class=\"meta\">{len(runs)} run(s) from {escape(str(ledger.path))}"
        f" · built from the ledger alone · generated {generated} · 95% intervals · headline is host cost only, "
        f"inference excluded</div><nav>{''.join(nav)}</nav>{headline}</header>"
        f"<main>{''.join(body)}</main></body></html>\n")


def write_html(ledger: Ledger, run_ids: Sequence[str], path: Path,
               reports: dict[str, RunReport] | None = None, price_files: Sequence[PriceFile] = ()) -> Path:
    page = build_html(ledger, run_ids, reports, price_files=price_files)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--html: cannot write {path} ({e.strerror}); choose a writable path") from None
    return path
