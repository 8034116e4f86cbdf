"""The HTML report tells the truth about real runs: every experiment command is run small, as a user
would, its report rendered to one page, the page opened in headless Chromium, and every keyed cell
(``data-key``) compared with the JSON report the same command wrote for the same run.

What this catches: a renderer that reads other field names than the producer writes (a "–", a
"0/0" or "n/a" where the JSON has numbers), a headline claimed without a confirmed window, a
section that silently disappears.
"""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from typing import Any

import pytest

from drumsbench.ledger import Ledger

from conftest import require
from helpers import MINI, chromium, chromium_missing, cli


class KeyedText(HTMLParser):
    """Text of every element that carries a ``data-key`` (nested markup included)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}
        self.images: dict[str, int] = {}  # key of a screenshot figure -> <img> inside
        self._open: list[tuple[str, str, int]] = []  # (key, tag, depth)
        self._text: dict[str, list[str]] = {}
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("img", "br", "meta", "input", "hr", "link"):
            if tag == "img":
                for key, _t, _d in self._open:
                    self.images[key] = self.images.get(key, 0) + 1
            return
        self._depth += 1
        key = dict(attrs).get("data-key")
        if key:
            self._open.append((key, tag, self._depth))
            self._text[key] = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("img", "br", "meta", "input", "hr", "link"):
            return
        if self._open and self._open[-1][2] == self._depth:
            key, _t, _d = self._open.pop()
            self.found[key] = re.sub(r"\s+", " ", "".join(self._text.pop(key))).strip()
        self._depth -= 1

    def handle_data(self, data: str) -> None:
        for key, _t, _d in self._open:
            self._text[key].append(data)


def first_number(text: str) -> float:
    m = re.search(r"-?[\d,]*\.?\d+(?:e[+-]?\d+)?", text)
    assert m, f"no number in {text!r}"
    return float(m.group(0).replace(",", ""))


def close(cell: str, value: float, rel: float = 0.006) -> bool:
    """The page shows ``value`` to 3–4 significant figures."""
    return abs(first_number(cell) - value) <= rel * abs(value) + 1e-9


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """One small run of every experiment command, in one ledger, with the JSON each one wrote."""
    require(chromium_missing())
    work = tmp_path_factory.mktemp("pages")
    out = work / "runs"
    env = {"DRUMSBENCH_STATE": str(work / "state")}
    common = ("--out", str(out), "--no-progress")
    made: dict[str, Any] = {"out": out, "work": work, "env": env, "stdout": {}}

    def step(name: str, *args: str, timeout: float = 600) -> None:
        before = set(Ledger(out / "ledger.sqlite").runs()) if (out / "ledger.sqlite").exists() else set()
        proc = cli(*args, *common, "--json", str(work / f"{name}.json"), env=env, timeout=timeout, check=True)
        (new,) = set(Ledger(out / "ledger.sqlite").runs()) - before
        made[name] = new
        made["stdout"][name] = proc.stdout
        made[f"{name}.json"] = json.loads((work / f"{name}.json").read_text())

    step("run", "run", "--tasks", MINI, "--attempts", "6", "--concurrency", "2", "--duration", "5m")
    step("sweep", "sweep", "--tasks", MINI, "--concurrency", "1", "--window", "3s", "--soak", "none",
         "--inject", "stale_generation=0.5")
    step("coldstart", "coldstart", "-n", "3", "--idle", "2", "--reset-n", "2")
    step("desktop-coldstart", "coldstart", "--tasks", "desktop", "--task", "writer-fix-typo", "-n", "2",
         "--reset-n", "1", timeout=900)
    step("isolation", "isolation", "--disk-mb", "8", "--procs", "20")
    step("branch", "branch", "--k", "1", "--ks", "1", "--continuations", "2", "--methods", "replay,file")
    step("desktop", "branch", "--env", "desktop", "--k", "1", "--ks", "1", "--continuations", "1",
         "--methods", "replay,file", timeout=900)
    step("project", "project", "--substrate", "process", "--trajectories", "1000", "--steps", "20",
         "--calibrate-attempts", "2", "--calibrate-steps", "3")
    step("train", "train", "--treatments", "exclude,zero", "--seeds", "1", "--iterations", "2", "--groups", "1",
         "--group-size", "2", "--task-ids", "textstats-empty-summary", "--holdout-every", "0", "--eval-every", "1",
         "--eval-episodes", "1", "--final-eval-episodes", "1", "--concurrency", "2")
    ids = [made[k] for k in ("run", "sweep", "coldstart", "desktop-coldstart", "isolation", "branch", "desktop",
                             "project", "train")]
    page = work / "report.html"
    cli("report", *ids, "--out", str(out), "--html", str(page), env=env, check=True)
    proc = chromium(page.as_uri(), work, "--dump-dom", "--virtual-time-budget=3000")
    assert proc.returncode == 0 and "<main>" in proc.stdout, proc.stderr[-2000:]
    parser = KeyedText()
    parser.feed(proc.stdout)
    made["cells"], made["images"], made["dom"] = parser.found, parser.images, proc.stdout
    yield made
    shutil.rmtree(work / "state", ignore_errors=True)


def test_every_keyed_cell_has_a_value(runs):
    cells = runs["cells"]
    assert len(cells) > 40, sorted(cells)
    # "n/a" is the truth only for a cost with no valid continuation and for the throughput of a sweep
    # with no confirmed window (both checked against the JSON below)
    empty = {k: v for k, v in cells.items() if v in ("", "–", "n/a", "0/0") and not k.endswith("/usd_per_valid")
             and k != f"{runs['sweep']}/cost/valid_per_host_hour"}
    assert not empty, empty
    assert "could not be rendered" not in runs["dom"]


def test_run_page_matches_its_json(runs):
    rid, data, cells = runs["run"], runs["run.json"], runs["cells"]
    assert cells[f"{rid}/headline/basis"] == "whole run, not a confirmed window" == data["headline_basis"]
    assert close(cells[f"{rid}/cost/valid_per_host_hour"], data["valid_per_host_hour"]["value"])
    assert close(cells[f"{rid}/headline/usd"].removeprefix("USD "), data["usd_per_valid_rollout"]["value"])
    assert "whole run, not a confirmed window" in runs["stdout"]["run"]  # the terminal says it too


def test_sweep_without_a_confirmed_window_has_no_headline(runs):
    rid, data, cells = runs["sweep"], runs["sweep.json"], runs["cells"]
    assert data["n_max"] is None and data["prices"] == []
    assert cells[f"{rid}/headline/usd"] == "no headline"
    assert cells[f"{rid}/cost/valid_per_host_hour"] == "n/a"
    assert cells[f"{rid}/cost/basis"] == "no confirmed window: no headline is claimed"
    assert cells[f"{rid}/sweep/n_max"].startswith("none")
    (window,) = data["windows"]
    assert int(first_number(cells[f"{rid}/window/{window['label']}/attempts"])) == window["attempts"]
    assert cells[f"{rid}/window/{window['label']}/confirmed"] == "not confirmed"
    out = runs["stdout"]["sweep"]
    assert "withheld" in out and "USD per valid rollout (" not in out


def test_coldstart_page_matches_its_json(runs):
    rid, cells = runs["coldstart"], runs["cells"]
    (r,) = runs["coldstart.json"]["results"]
    key = f"{rid}/coldstart/{r['substrate']}"
    assert close(cells[f"{key}/first_command_p50_ms"], r["first_command"]["p50"]["value"] * 1000)
    assert close(cells[f"{key}/floor_p50_ms"], r["floor"]["p50"]["value"] * 1000)
    for strategy in ("in_place", "recreate"):
        assert close(cells[f"{key}/reset_{strategy}_p50_ms"], r["reset"][strategy]["p50"]["value"] * 1000)
    assert len(r["first_command"]["samples_s"]) == 3  # the CDF is drawn from the real samples


def test_desktop_coldstart_page_and_terminal_match_its_json(runs):
    rid, cells = runs["desktop-coldstart"], runs["cells"]
    data = runs["desktop-coldstart.json"]
    assert data["results"] == [] and data["config"]["tasks"] == "desktop"
    (d,) = data["desktop"]
    assert d["substrate"] == "process" and d["task"] == "writer-fix-typo"
    assert d["success"]["value"] == 1.0 and len(d["start"]["samples_s"]) == 2, d["errors"]
    assert set(d["reset"]) == {"in_place", "recreate"} and d["floor"] is not None
    assert close(cells[f"{rid}/desktop-coldstart/process/start_p50_ms"], d["start"]["p50"]["value"] * 1000)
    assert "desktop cold start on writer-fix-typo" in runs["stdout"]["desktop-coldstart"]


def test_isolation_page_matches_its_json(runs):
    rid, cells = runs["isolation"], runs["cells"]
    for sub, r in runs["isolation.json"]["substrates"].items():
        assert r["probes"], r
        for p in r["probes"]:
            assert cells[f"{rid}/isolation/{sub}/{p['probe']}"] == p["verdict"]
        assert cells[f"{rid}/isolation/{sub}/canary"] == ("fired" if r["canary_control_fired"] else "DID NOT FIRE")


@pytest.mark.parametrize("name", ["branch", "desktop"])
def test_branch_page_matches_its_json(runs, name):
    rid, data, cells = runs[name], runs[f"{name}.json"], runs["cells"]
    assert data["methods"], data
    for m in data["methods"]:
        key = f"{rid}/branch/{m['method']}"
        assert close(cells[f"{key}/creation_p50_ms"], m["creation_sequential"]["p50"]["value"] * 1000)
        assert close(cells[f"{key}/creation_parallel_p50_ms"], m["creation_parallel"]["p50"]["value"] * 1000)
        assert close(cells[f"{key}/handover_p50_ms"], m["handover_sequential"]["p50"]["value"] * 1000)
        assert close(cells[f"{key}/capture_p50_ms"], m["capture"]["p50"]["value"] * 1000)
        for dim, share in m["faithful"].items():
            assert share["total"] > 0
            assert cells[f"{key}/faithful/{dim}"] == f"{share['faithful']}/{share['total']}"
        assert cells[f"{key}/valid"] == f"{m['valid']} of {m['continuations']}"
        assert close(cells[f"{key}/valid_per_host_hour"], m["valid_per_host_hour"]["value"])
        usd = m["usd_per_valid_continuation"]["value"]
        assert (cells[f"{key}/usd_per_valid"] == "n/a") if usd is None else close(cells[f"{key}/usd_per_valid"], usd)
    assert cells[f"{rid}/branch/unchanged"] == str(data["prepared_unchanged"])
    (ratio,) = data["ratios"]  # file against replay: end to end, beside the creation ratio
    for what in ("end_to_end", "creation"):
        assert close(cells[f"{rid}/branch/ratio/file/{what}"], ratio[what]["value"]), what


def test_desktop_branch_page_has_the_prepared_screen_and_one_per_method(runs):
    rid, data, images = runs["desktop"], runs["desktop.json"], runs["images"]
    task = data["task"]
    assert images.get(f"{rid}/screenshot/{task}/prepared/prepared") == 1, sorted(images)
    for m in data["methods"]:
        assert images.get(f"{rid}/screenshot/{task}/{m['method']}/continuation") == 1, (m["method"], sorted(images))


def test_projection_page_matches_its_json(runs):
    rid, cells = runs["project"], runs["cells"]
    for p in runs["project.json"]["projections"]:
        assert close(cells[f"{rid}/projection/{p['label']}/worker_hours"], p["worker_hours"]["value"], rel=0.002)


def test_training_page_matches_its_json(runs):
    rid, data, cells = runs["train"], runs["train.json"], runs["cells"]
    assert {c["treatment"] for c in data["curves"]} == {"exclude", "zero"}
    for f in data["finals"]:
        assert close(cells[f"{rid}/train/{f['treatment']}/final_success"], f["success"]["value"], rel=0.002) \
            if f["success"]["value"] else cells[f"{rid}/train/{f['treatment']}/final_success"].startswith("0")
    for k in data["costs"]:
        assert int(first_number(cells[f"{rid}/train/{k['treatment']}/invalid_in_loss"])) == k["invalid_in_loss"]
    assert "learning curves per treatment" in runs["dom"]


def test_report_reads_and_never_writes(runs):
    """``drumsbench report`` on every kind prints and writes its JSON files, and leaves the ledger as it was."""
    out, env = runs["out"], runs["env"]
    db = out / "ledger.sqlite"
    before = Ledger(db).db.execute("SELECT kind, name, data FROM artifacts ORDER BY run_id, kind, name").fetchall()
    for name in ("run", "sweep", "coldstart", "desktop-coldstart", "isolation", "branch", "project"):
        cli("report", runs[name], "--out", str(out), env=env, check=True)
    after = Ledger(db).db.execute("SELECT kind, name, data FROM artifacts ORDER BY run_id, kind, name").fetchall()
    assert before == after
    desktop = json.loads((out / runs["desktop-coldstart"] / "coldstart.json").read_text())
    assert desktop["desktop"] == runs["desktop-coldstart.json"]["desktop"]  # the report from the ledger alone
    again = json.loads((out / runs["branch"] / "branch-report.json").read_text())
    assert again["methods"] == runs["branch.json"]["methods"]
