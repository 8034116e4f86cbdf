"""The HTML report as a person meets it: real runs, one file, opened in a real headless Chromium.

The browser runs in its own network namespace when the machine allows one (nothing can leave), with
host resolution disabled and a dead proxy, and writes a net log. The page's own requests are the
net-log requests whose network isolation key is the file:// page; a control page that references an
http image proves that this detector fires.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from drumsbench.core.outcome import InvalidCause
from drumsbench.ledger import Ledger
from drumsbench.measure import summary
from drumsbench.measure.stats import rate_per_hour, wilson
from drumsbench.report.html import build_html
from drumsbench.testing.sample_ledger import synthesize

from conftest import require
from helpers import chromium, chromium_missing, cli

SECTIONS_ALWAYS = ("outcomes", "cost", "latency", "tasks", "controls", "conditions")
SECTIONS_ARTIFACTS = ("sweep", "branch", "projection", "screenshots")
OK_SCHEMES = ("file:", "data:", "about:", "chrome:", "blob:", "chrome-extension:", "devtools:")


# -- chromium -----------------------------------------------------------------------------------------

def page_requests(netlog: Path) -> list[str]:
    """URLs the page (a file:// document) asked for that are not file:/data:; from a Chromium net log."""
    text = netlog.read_text()
    try:
        log = json.loads(text)
    except json.JSONDecodeError:  # a log cut short at exit: close it
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for e in log.get("events", []):
        p = e.get("params") or {}
        if types.get(e["type"]) != "URL_REQUEST_START_JOB" or "url" not in p:
            continue
        from_page = "file://" in str(p.get("network_isolation_key", "")) or \
            "file://" in str(p.get("site_for_cookies", ""))
        if from_page and not p["url"].startswith(OK_SCHEMES):
            urls.append(p["url"])
    return urls


GEOMETRY_JS = """<script>
addEventListener('load', () => {
  const r = [...document.querySelectorAll('svg.plot')].map(s => {
    const b = s.getBoundingClientRect();
    return [b.left + scrollX, b.top + scrollY, b.width, b.height, s.querySelectorAll('path,circle,rect,line').length];
  });
  const imgs = [...document.querySelectorAll('figure.shot img')].map(i => [i.naturalWidth, i.naturalHeight]);
  const pre = document.createElement('pre'); pre.id = 'geometry'; pre.style.display = 'none';
  pre.textContent = JSON.stringify({plots: r, imgs, height: document.documentElement.scrollHeight});
  document.body.appendChild(pre);
});
</script>"""


def geometry(html: Path, work: Path, width: int) -> dict:
    """Plot rectangles and page height, measured by an instrumented copy of the page (same layout)."""
    page = html.read_text()
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    work.mkdir(parents=True, exist_ok=True)
    probe = work / "probe.html"
    probe.write_text(page.replace("</body>", GEOMETRY_JS + "</body>"))
    proc = chromium(probe.as_uri(), work, "--dump-dom", f"--window-size={width},1000",
                    "--virtual-time-budget=5000")
    m = re.search(r'<pre id="geometry"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the geometry probe did not run: {proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"'))


def plot_pixels(png: Path, rects: list[list[float]]) -> list[dict[str, float]]:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    out = []
    for x, y, w, h, _ in rects:
        crop = img[int(y):int(y + h), int(x):int(x + w)]
        flat = crop.reshape(-1, 3)
        inked = float((flat.min(axis=1) < 235).mean()) if len(flat) else 0.0
        colourful = int(((flat.max(axis=1) - flat.min(axis=1)) > 60).sum())
        out.append({"std": float(crop.std()) if crop.size else 0.0, "inked": inked, "colourful": colourful,
                    "h": float(crop.shape[0]) if crop.size else 0.0})
    return out


# -- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


def _real_runs(out: Path, env: dict[str, str]) -> list[str]:
    inject = "stale_generation=0.08,verifier_unavailable=0.08,step_timeout=0.05"
    cli("run", "--tasks", "coding", "--policy", "noisy", "--concurrency", "2", "--attempts", "40", "--duration", "10m",
        "--step-timeout", "1s", "--episode-timeout", "2.5s", "--inject", inject, "--out", str(out), "--no-progress",
        env=env, check=True)
    cli("run", "--tasks", "coding", "--policy", "oracle", "--concurrency", "1", "--attempts", "20", "--duration", "10m",
        "--usd-per-host-hour", "0.25", "--out", str(out), "--no-progress", env=env, check=True)
    return Ledger(out / "ledger.sqlite").runs()


# -- tests ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_html_report_renders_offline_in_chromium(tmp_path, env):
    require(chromium_missing())
    out = tmp_path / "runs"
    runs = _real_runs(out, env)
    assert len(runs) == 2
    led = Ledger(out / "ledger.sqlite")
    synthesize(led, "synthetic-sweep", 3000, seed=3)  # every artifact kind, beside the real runs
    led.close()
    html = tmp_path / "report.html"
    proc = cli("report", *runs, "synthetic-sweep", "--out", str(out), "--html", str(html), env=env, check=True)
    assert "valid rollouts per" in proc.stdout  # the terminal report is still printed
    page = html.read_text()

    # one self-contained file: no script, stylesheet, font or image from anywhere
    assert "could not be rendered" not in page
    for sid in SECTIONS_ALWAYS + SECTIONS_ARTIFACTS:
        assert f'<section id="{sid}">' in page, sid
    assert not re.search(r"<script|<link|@import|@font-face|url\(", page, re.I)
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)
    assert refs and all(r.startswith(("#", "data:image/png;base64,", "data:image/jpeg;base64,")) for r in refs), \
        sorted({r[:40] for r in refs})
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    for rid in runs:
        assert page.count(rid) >= 5, rid
    for cause in InvalidCause:
        assert f"invalid: {cause.value}</td>" in page

    # real Chromium: the plots render (not blank) and the page asks for nothing
    work = tmp_path / "chromium"
    geo = geometry(html, work, 1400)
    plots = geo["plots"]
    n_svg = page.count('<svg class="plot"')
    assert len(plots) == n_svg >= 12, (len(plots), n_svg)
    assert all(p[2] > 150 and p[3] > 80 and p[4] > 10 for p in plots), plots
    assert len(geo["imgs"]) == 6 and all(w == 320 and h == 200 for w, h in geo["imgs"]), geo["imgs"]
    height = min(int(geo["height"]) + 20, 16000)
    shot = tmp_path / "report.png"
    netlog = tmp_path / "netlog.json"
    proc = chromium(html.as_uri(), work, f"--screenshot={shot}", f"--window-size=1400,{height}",
                    f"--log-net-log={netlog}", "--net-log-capture-mode=Default", "--virtual-time-budget=5000")
    assert shot.exists(), proc.stderr[-2000:]
    stats = plot_pixels(shot, [p for p in plots if p[1] + p[3] <= height])
    assert len(stats) >= 12
    for i, s in enumerate(stats):
        assert s["std"] > 8 and s["inked"] > 0.01 and s["colourful"] > 30, (i, s, plots[i])
    assert page_requests(netlog) == []
    if os.environ.get("DRUMSBENCH_HTML_SCREENSHOT"):  # where a developer wants the screenshot, to look at it
        shutil.copy(shot, os.environ["DRUMSBENCH_HTML_SCREENSHOT"])

    # positive control: the same detector sees a page that does reference the network
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><body><p>control</p><img src="http://127.0.0.1:9/leak.png">'
                       "</body></html>")
    netlog2 = tmp_path / "netlog-control.json"
    chromium(control.as_uri(), work, f"--screenshot={tmp_path / 'control.png'}", "--window-size=400,300",
             f"--log-net-log={netlog2}", "--net-log-capture-mode=Default", "--virtual-time-budget=3000")
    assert page_requests(netlog2) == ["http://127.0.0.1:9/leak.png"]


def test_sections_follow_the_artifacts(tmp_path):
    """Experiment sections appear only when a run has their artifacts; a broken artifact costs only its section."""
    led = Ledger(tmp_path / "ledger.sqlite")
    synthesize(led, "bare", 400, seed=1, artifacts=False, soak=False)
    synthesize(led, "full", 400, seed=2)
    bare = build_html(led, ["bare"])
    for sid in SECTIONS_ALWAYS:
        assert f'<section id="{sid}">' in bare
    for sid in SECTIONS_ARTIFACTS:
        assert f'<section id="{sid}">' not in bare, sid
    both = build_html(led, ["bare", "full"])
    for sid in SECTIONS_ALWAYS + SECTIONS_ARTIFACTS:
        assert f'<section id="{sid}">' in both, sid
    assert "could not be rendered" not in both
    assert "confirmed windows at N_max = 8" in both and "whole run, not a confirmed window" in both
    assert both.count('<tr class="diff">') >= 3  # differing configuration rows are marked
    # only raster images are embedded: anything else (an SVG that could fetch) is refused
    led.put_artifact("full", "screenshot", "evil/1/start", {
        "task": "evil", "seq": 1, "stage": "start",
        "png_base64": base64.b64encode(b'<svg><image href="http://x/y.png"/></svg>').decode()})
    led.put_artifact("full", "window", "broken", "not an object")
    page = build_html(led, ["full"])
    assert "image not available" in page and "http://x" not in page
    assert page.count("could not be rendered") == 1 and "window artifact does not fit its model" in page
    assert '<section id="branch">' in page


def test_isolation_control_that_did_not_fire_is_shown(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    synthesize(led, "nofire", 300, seed=4, control_fires=False, soak=False)
    page = build_html(led, ["nofire"])
    assert "DID NOT FIRE" in page and "isolation unconfirmed" in page


def test_report_cli_errors(tmp_path, env):
    out = tmp_path / "runs"
    led = Ledger(out / "ledger.sqlite")
    synthesize(led, "one", 50, seed=5, soak=False)
    synthesize(led, "two", 50, seed=6, soak=False)
    led.close()
    (tmp_path / "file").write_text("x")
    for args, needle in [(["one", "two", "--json", str(tmp_path / "r.json")], "--json"),
                         (["one", "nosuch", "--html", str(tmp_path / "r.html")], "nosuch"),
                         (["one", "--html", str(tmp_path / "file" / "r.html")], "--html")]:
        proc = cli("report", *args, "--out", str(out), env=env)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and needle in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "r.html").exists()  # an unknown run id stops before anything is written
    ok = cli("report", "one", "two", "--out", str(out), "--html", str(tmp_path / "two.html"), env=env, check=True)
    assert ok.stdout.count("USD per valid rollout") == 2 and (tmp_path / "two.html").stat().st_size > 20_000


# -- summary.build: faster, same results -------------------------------------------------------------------

def _reference_build_counts(led: Ledger, run_id: str) -> dict:
    """The original one-pass-per-attempt computation of summary.build (before it used SQL and numpy)."""
    segs = led.segments(run_id)
    host_s = sum(max(0.0, e - s) for s, e, _ in segs)
    rows = led.attempts(run_id, ("task", "outcome", "cause", "injected", "t_end", "provision_s", "reset_s",
                                 "steps_s", "verify_s", "teardown_s", "t_start"))
    invalid = {c.value: 0 for c in InvalidCause}
    injected = dict(invalid)
    caught = dict(invalid)
    tasks: dict[str, list[int]] = {}
    not_injected = success = failed = 0
    valid_times: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in summary.PHASES}
    for task, outcome, cause, inj, t_end, prov, reset, steps, verify, teardown, t_start in rows:
        line = tasks.setdefault(task, [0, 0, 0, 0])
        line[0] += 1
        if inj:
            injected[inj] += 1
            caught[inj] += cause == inj
        if outcome == "invalid":
            invalid[cause] += 1
            line[3] += 1
            not_injected += not inj
        else:
            valid_times.append(summary._offset(segs, t_end))
            if outcome == "success":
                success += 1
                line[1] += 1
            else:
                failed += 1
                line[2] += 1
        if prov:
            phases["provision"].append(prov)
        phases["reset"].append(reset)
        phases["step"].extend(json.loads(steps))
        if verify:
            phases["verify"].append(verify)
        if teardown:
            phases["teardown"].append(teardown)
        phases["attempt"].append(t_end - t_start)
    n = len(rows)
    return {"attempts": n, "success": success, "failed": failed, "invalid": invalid, "injected": injected,
            "injected_caught": caught, "invalid_not_injected": not_injected,
            "tasks": {t: dict(zip(("attempts", "success", "failed", "invalid"), v, strict=True))
                      for t, v in sorted(tasks.items())},
            "invalid_rate": wilson(n - success - failed, n).model_dump(mode="json"),
            "valid_per_host_hour": rate_per_hour(valid_times, host_s).model_dump(mode="json"),
            "phases": {p: summary._latency(v).model_dump(mode="json") for p, v in phases.items()}}


def test_summary_build_matches_the_reference(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    synthesize(led, "s", 2500, seed=7)
    synthesize(led, "empty", 0, seed=8, artifacts=False, soak=False, concurrency=(1,))
    for rid in ("s", "empty"):
        got = summary.build(led, rid).dump()
        want = _reference_build_counts(led, rid)
        for key, value in want.items():
            assert got[key] == value, (rid, key)
    # offsets of many times at once equal the scalar definition, before, inside, between and after segments
    segs = led.segments("s")
    ts = np.concatenate([np.linspace(segs[0][0] - 10, segs[-1][1] + 10, 997), [s for s, _, _ in segs],
                         [e for _, e, _ in segs]])
    assert list(summary._offsets(segs, ts)) == [summary._offset(segs, float(t)) for t in ts]



def test_binom_ppf_is_scipy_stats():
    from scipy import stats as sst

    from drumsbench.measure.stats import binom_ppf

    for n in [*range(1, 60), 997, 100_000, 1_000_000]:
        for p in (0.01, 0.5, 0.95, 0.99):
            for q in (0.025, 0.975):
                assert binom_ppf(q, n, p) == float(sst.binom.ppf(q, n, p)), (q, n, p)


def test_branch_section_keeps_hand_over_apart_and_compares_end_to_end(tmp_path):
    """criu's continuations are made ahead of demand: its creation cell is the restore's cost, its
    hand-over its own cell; each method against replay end to end, beside the creation ratio."""
    from drumsbench.measure.artifacts import load_run

    led = Ledger(tmp_path / "ledger.sqlite")
    synthesize(led, "full", 300, seed=2, soak=False)
    arts = load_run(led, "full")
    page = build_html(led, ["full"])
    criu = arts.branch["criu"]
    assert criu.handover_sequential is not None and criu.capture is not None

    def ms_cell(name: str) -> float:
        cell = re.search(rf'data-key="full/branch/criu/{name}">([^<]*)', page)
        assert cell, name
        return float(cell.group(1).replace(",", ""))

    assert ms_cell("handover_p50_ms") == pytest.approx(criu.handover_sequential.p50.value * 1000, rel=2e-3)
    assert f"({criu.made_ahead} of {criu.continuations})" in page.split('full/branch/criu/handover_p50_ms')[1][:400]
    assert ms_cell("creation_p50_ms") == pytest.approx(criu.creation_sequential.p50.value * 1000, rel=2e-3)
    assert ms_cell("capture_p50_ms") == pytest.approx(criu.capture.p50.value * 1000, rel=2e-3)
    summary = arts.branch_summary
    assert summary is not None and {r.method for r in summary.ratios} == {"file", "criu"}
    for r in summary.ratios:
        for what, e in (("end_to_end", r.end_to_end), ("creation", r.creation)):
            got = re.search(rf'data-key="full/branch/ratio/{r.method}/{what}">([^<]*)', page)
            assert got and float(got.group(1).split()[0]) == pytest.approx(e.value, rel=2e-3), (r.method, what)


def test_each_artifact_kind_is_registered_once_and_shown_by_a_section() -> None:
    """``measure/artifacts.LOADED`` fills each ``RunArtifacts`` field once; every kind it reads (and
    the training report) belongs to a section of ``report/html/page.sections``, so an unreadable
    artifact is said in place."""
    import dataclasses

    from drumsbench.measure import artifacts as A
    from drumsbench.measure.train_report import TrainReport
    from drumsbench.report.html.cells import Palette
    from drumsbench.report.html.page import sections

    fields = {f.name for f in dataclasses.fields(A.RunArtifacts)} - {"train", "other_kinds", "errors"}
    filled = [entry.field for entry in A.LOADED]
    assert sorted(filled) == sorted(fields) and len(set(filled)) == len(filled)
    assert len({entry.model.KIND for entry in A.LOADED}) == len(A.LOADED)
    page = sections([], Palette(), Path("."))
    assert len({s.sid for s in page}) == len(page)
    shown = {kind for s in page for kind in s.kinds}
    # raw leak samples are read by no section (each window carries its leak verdict)
    assert {entry.model.KIND for entry in A.LOADED} - {A.LeakSamplesArtifact.KIND} <= shown
    assert TrainReport.KIND in shown and shown <= A.KNOWN_KINDS
