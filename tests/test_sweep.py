"""Sweeps: windows judged with their reasons, N_max, soak, bursts, faults that unconfirm a window."""

from __future__ import annotations

import json
import sqlite3

import pytest

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.windows import Criteria, judge, pooled_rate

from helpers import MINI, ROOT, cli

CHECKS = ["full_length", "invalid_rate", "isolation_control", "stable"]


@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


# -- judging a window from the ledger alone (synthetic, exact) -------------------------------------

T0 = 1_700_000_000.0


def _window(db: Ledger, label: str, ends: list[float], invalid: tuple[int, ...] = (), planned: float = 10.0,
            ran: float | None = None, interrupted: bool = False, fired: bool | None = True, n: int = 2) -> None:
    run_id = "r"
    seg = db.start_segment(run_id, 1, label)
    start = T0
    seq = db.next_seq(run_id)
    for i, t in enumerate(ends):
        bad = i in invalid
        db.record(AttemptRecord(
            run_id=run_id, seq=seq + i, task="t", substrate="process", env="coding", policy="oracle", window=label,
            concurrency=n, outcome=Outcome.INVALID if bad else Outcome.SUCCESS,
            cause=InvalidCause.STALE_GENERATION if bad else None, reward=None if bad else 1.0,
            t_start=start + t - 0.5, t_end=start + t))
    end = start + (ran if ran is not None else planned + 0.2)
    db.db.execute("UPDATE segments SET started = ?, ended = ? WHERE run_id = ? AND seg = ?",
                  (start - 0.1, end, run_id, seg))
    artifacts.put(db, run_id, label, artifacts.SegmentArtifact(
        concurrency=n, planned_s=planned, max_attempts=None, work_started=start, ended=end, interrupted=interrupted,
        config={}, resources={"cpu_busy": {"mean": 0.5, "max": 0.9}}))
    if fired is not None:
        db.record_control(run_id, label, "isolation", fired, "test")


@pytest.fixture
def db(tmp_path):
    d = Ledger(tmp_path / "ledger.sqlite")
    d.create_run("r", "sweep", {}, {}, "test")
    return d


def test_a_steady_window_is_confirmed_with_every_reason(db):
    _window(db, "N2", [i * 0.5 + 0.25 for i in range(20)])
    v = judge(db, "r", "N2", Criteria())
    assert v.confirmed and [c.name for c in v.checks] == CHECKS and all(c.passed for c in v.checks)
    assert v.valid == 20 and v.valid_per_host_hour.value == pytest.approx(20 / 10 * 3600)
    assert v.halves_differ == 0
    assert v.resources["cpu_busy"]["mean"] == 0.5


def test_each_check_can_unconfirm_a_window(db):
    steady = [i * 0.5 + 0.25 for i in range(20)]
    _window(db, "short", steady, ran=4.0, interrupted=True)
    _window(db, "faulty", steady, invalid=(3, 10, 17))
    _window(db, "nocontrol", steady, fired=None)
    _window(db, "misfire", steady, fired=False)
    _window(db, "drifting", [i * 0.25 for i in range(1, 19)] + [9.5, 9.9])
    crit = Criteria(invalid_threshold=0.01, stability=0.25)
    failed = {lab: [c.name for c in judge(db, "r", lab, crit).checks if not c.passed]
              for lab in ("short", "faulty", "nocontrol", "misfire", "drifting")}
    assert failed == {"short": ["full_length"], "faulty": ["invalid_rate"], "nocontrol": ["isolation_control"],
                      "misfire": ["isolation_control"], "drifting": ["stable"]}
    faulty = judge(db, "r", "faulty", crit)
    assert not faulty.confirmed and "3/20 = 15.0% > threshold 1.0%" in faulty.reasons[0]
    assert "stale_generation 3" in faulty.reasons[0]
    # invalid attempts never count toward throughput
    assert faulty.valid_per_host_hour.value == pytest.approx(17 / 10 * 3600)


def test_drain_after_the_deadline_is_not_throughput(db):
    _window(db, "N1", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10.4, 10.6], planned=10, ran=11)
    v = judge(db, "r", "N1", Criteria())
    assert v.attempts == 12 and v.valid_per_host_hour.n == 10
    assert pooled_rate(db, "r", ["N1"]).value == pytest.approx(3600)


# -- the real CLI on the process substrate ------------------------------------------------------------

def _one_line_error(proc, needle):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert needle in lines[-1], proc.stderr
    assert len(lines) == 1 or lines[0].startswith("Usage:"), proc.stderr


def test_sweep_finds_n_max_and_judges_every_window(tmp_path, env):
    out = tmp_path / "runs"
    proc = cli("sweep", "--tasks", "coding", "--concurrency", "1,2,4", "--window", "4s", "--soak", "3s",
               "--burst", "1s", "--stability", "0.6", "--out", str(out), "--json", str(tmp_path / "s.json"),
               env=env, check=True)
    r = json.loads((tmp_path / "s.json").read_text())
    assert r["schema"] == "drumsbench.sweep-report/1" and r["status"] == "complete"
    steps = [w for w in r["windows"] if w["kind"] == "step"]
    assert steps and [w["label"] for w in steps] == [f"N{w['concurrency']}" for w in steps]
    for w in r["windows"]:
        names = [c["name"] for c in w["checks"]]  # a soak long enough to judge adds its leak check
        assert names == CHECKS or (w["kind"] == "soak" and names == [*CHECKS, "leaks"]), (w["label"], names)
        assert all(c["detail"] for c in w["checks"])
        assert w["confirmed"] == all(c["passed"] for c in w["checks"])
        assert w["resources"]["cpu_busy"]["mean"] is not None
        assert 0 < w["resources"]["live_sandboxes"]["max"] <= w["concurrency"]
        assert w["resources"]["memory_used_gib"]["mean"] > 0
        # a window's verdict and every failed reason are shown in the terminal report
        assert w["label"] in proc.stdout
        for c in w["checks"]:
            if not c["passed"]:
                assert c["detail"][:40] in proc.stdout.replace("\n", " ") or c["name"] in proc.stdout
    confirmed = [w["concurrency"] for w in steps if w["confirmed"]]
    assert confirmed, "no confirmed window on an idle process substrate: " + proc.stdout
    assert r["n_max"] == max(confirmed)
    # every planned N is either a window or listed as not run, with the reason
    ran = {w["concurrency"] for w in steps}
    assert ran | {x["concurrency"] for x in r["not_run"]} == {1, 2, 4}
    assert all(x["reason"] for x in r["not_run"])
    if r["not_run"]:
        assert r["climb_stopped"]
    # soak at N_max, judged the same way
    assert r["soak"]["concurrency"] == r["n_max"] and r["soak"]["label"] == f"soak-N{r['n_max']}"
    assert [c["name"] for c in r["soak"]["checks"]][:4] == CHECKS
    # steady state only from confirmed windows at N_max; the burst never counts
    counted = [w for w in r["windows"] if w["counted"]]
    assert {w["label"] for w in counted} == set(r["steady_state"]["windows"])
    assert all(w["confirmed"] and w["concurrency"] == r["n_max"] and w["kind"] != "burst" for w in counted)
    assert r["steady_state"]["valid_per_host_hour"]["value"] > 0
    assert "bootstrap" in r["steady_state"]["valid_per_host_hour"]["method"] or \
        "poisson" in r["steady_state"]["valid_per_host_hour"]["method"]
    assert len(r["bursts"]) == 1 and r["bursts"][0]["kind"] == "burst" and not r["bursts"][0]["counted"]
    assert r["bursts"][0]["concurrency"] == 4
    assert "never as steady state" in proc.stdout
    assert "excluded" in r["inference_cost"] and r["prices"][0]["usd_per_valid_rollout"]["value"] > 0
    # each window has its own positive control in the ledger
    db = sqlite3.connect(out / "ledger.sqlite")
    controls = dict(db.execute("SELECT window, fired FROM controls").fetchall())
    assert set(controls) == {w["label"] for w in r["windows"]}
    assert db.execute("SELECT kind FROM runs").fetchone()[0] == "sweep"
    # the report is rebuilt from the ledger alone and says the same
    cli("report", r["run_id"], "--out", str(out), "--json", str(tmp_path / "again.json"), env=env, check=True)
    again = json.loads((tmp_path / "again.json").read_text())
    for key in ("n_max", "steady_state", "not_run", "climb_stopped", "soak_held"):
        assert again[key] == r[key], key
    assert [w["confirmed"] for w in again["windows"]] == [w["confirmed"] for w in r["windows"]]
    # the judged windows are published for the HTML report (docs/html-report.md) and it renders them
    published = {name: json.loads(data) for name, data in db.execute(
        "SELECT name, data FROM artifacts WHERE kind = 'window'").fetchall()}
    assert {n: w["role"] for n, w in published.items()} == {
        w["label"]: {"step": "window", "soak": "soak", "burst": "burst"}[w["kind"]] for w in r["windows"]}
    assert all(w["reasons"] and "confirmed" in w for w in published.values())
    summary = json.loads(db.execute("SELECT data FROM artifacts WHERE kind = 'sweep'").fetchone()[0])
    assert summary["n_max"] == r["n_max"]
    cli("report", r["run_id"], "--out", str(out), "--html", str(tmp_path / "r.html"), env=env, check=True)
    page = (tmp_path / "r.html").read_text()
    assert "Sweep: windows" in page and "could not be rendered" not in page


def test_faults_above_the_threshold_unconfirm_a_window_and_do_not_count(tmp_path, env):
    out = tmp_path / "runs"
    proc = cli("sweep", "--tasks", MINI, "--concurrency", "1,2,4", "--window", "3s", "--soak", "2s",
               "--inject", "stale_generation=0.3", "--inject-at", "2", "--stability", "1",
               "--price", str(ROOT / "examples" / "prices" / "on-demand.toml"), "--out", str(out),
               "--json", str(tmp_path / "s.json"), env=env, check=True)
    r = json.loads((tmp_path / "s.json").read_text())
    by = {w["label"]: w for w in r["windows"]}
    n2 = by["N2"]
    assert not n2["confirmed"] and n2["invalid"] > 0 and n2["invalid_by_cause"]["stale_generation"] == n2["invalid"]
    failed = [c for c in n2["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["invalid_rate"] and "> threshold 1.0%" in failed[0]["detail"]
    assert "NOT confirmed" in proc.stdout and "stale_generation" in proc.stdout
    # climbing stopped at the unconfirmed window; N_max is the largest confirmed N below it
    assert r["n_max"] == 1 and r["climb_stopped"] == "N=2 not confirmed"
    assert [x["concurrency"] for x in r["not_run"]] == [4]
    assert by["N1"]["confirmed"] and by["N1"]["injected"] == 0 and by["soak-N1"]["injected"] == 0
    # the faulty window's rollouts are not in the steady-state figure
    assert not n2["counted"] and "N2" not in r["steady_state"]["windows"]
    assert r["steady_state"]["windows"] == (["N1", "soak-N1"] if by["soak-N1"]["confirmed"] else ["N1"])
    counted = [by[lab] for lab in r["steady_state"]["windows"]]
    assert r["steady_state"]["valid"] == sum(w["valid_per_host_hour"]["n"] for w in counted)
    hours = sum(w["measured_s"] for w in counted) / 3600
    assert r["steady_state"]["valid_per_host_hour"]["value"] == pytest.approx(r["steady_state"]["valid"] / hours)
    # the cloud price: the 24-hour minimum is applied to this seconds-long sweep
    cloud = r["prices"][0]
    assert cloud["billed_hours"] == 24 and cloud["billed_usd_per_valid_rollout"]["value"] > \
        100 * cloud["usd_per_valid_rollout"]["value"]
    attribution = r["attribution"][0]
    assert attribution["verified_attempts"] == sum(w["valid"] for w in counted)


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "4,2"], "strictly increasing"),
    (["--concurrency", "1,x"], "'x' is not an integer"),
    (["--concurrency", "0,1"], "out of range"),
    (["--concurrency", ""], "--concurrency"),
    (["--window", "-1s"], "--window"),
    (["--window", "soon"], "not a duration"),
    (["--soak", "forever"], "--soak"),
    (["--burst", "0.5x"], "--burst"),
    (["--invalid-threshold", "1.5"], "--invalid-threshold"),
    (["--stability", "0"], "--stability"),
    (["--min-gain", "-1"], "--min-gain"),
    (["--burst-concurrency", "0"], "--burst-concurrency"),
    (["--inject", "stale_generation=0.1", "--inject-at", "8"], "--inject-at: 8 is not one of"),
    (["--inject-at", "2"], "give --inject too"),
    (["--inject", "bogus=0.1"], "unknown cause"),
    (["--substrate", "nosuch"], "unknown substrate"),
    (["--policy", "genius"], "unknown policy"),
    (["--price", "/nonexistent/prices.toml"], "--price: no file"),
])
def test_bad_sweep_arguments_one_line_exit_2(tmp_path, env, args, needle):
    proc = cli("sweep", "--tasks", MINI, "--concurrency", "1,2", "--window", "1s", "--soak", "none",
               "--out", str(tmp_path / "runs"), *args, env=env)
    _one_line_error(proc, needle)
    ledger = tmp_path / "runs" / "ledger.sqlite"
    if ledger.exists():
        assert sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
