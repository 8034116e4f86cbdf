"""The 1M x 150-step projection: its arithmetic, and a check against real 150-step trajectories."""

from __future__ import annotations

import json

import pytest

from drumsbench.measure import projection
from drumsbench.substrates import registry

from conftest import require
from helpers import MINI, cli


@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


def _row(provision, reset, steps, verify, harness=0.01, outcome="success"):
    total = provision + reset + sum(steps) + verify + harness
    return (outcome, provision, reset, json.dumps(steps), verify, 0.0, 100.0, 100.0 + total)


def test_formula_and_intervals():
    rows = [_row(0.5 if i == 0 else 0.0, 0.02, [0.01] * 10, 0.2) for i in range(10)]
    rows.append(_row(0.0, 0.02, [0.01] * 10, 0.2, outcome="invalid"))  # invalid attempts are not measured
    p = projection.project("x/in_place", "x", "in_place", 1, ["r"], rows, trajectories=1_000_000, steps=150)
    t = p.terms
    assert t.n == 10 and t.mean_steps == 10
    assert t.provision.value == pytest.approx(0.5) and t.provision.n == 1
    assert t.fresh_start.value == pytest.approx(0.52)
    assert t.cold_start.value == pytest.approx(0.02)  # a long run: the first sandbox is created once per worker
    assert t.per_step.value == pytest.approx(0.01) and t.verify.value == pytest.approx(0.2)
    assert t.harness.value == pytest.approx(0.01)
    per = 0.02 + 150 * 0.01 + 0.2
    assert p.per_trajectory_s.value == pytest.approx(per)
    assert p.per_trajectory_full_s.value == pytest.approx(per + 0.01)
    assert p.worker_hours.value == pytest.approx(per * 1_000_000 / 3600)
    for e in (p.per_trajectory_s, p.worker_hours, t.cold_start):
        assert e.low <= e.value <= e.high
    assert p.worker_hours.high >= p.worker_hours.low


def test_check_compares_at_the_real_step_count():
    calib = [_row(0.0, 0.02, [0.01] * 30, 0.2) for _ in range(8)]
    real = [_row(0.0, 0.02, [0.0105] * 150, 0.2) for _ in range(3)]
    p = projection.project("x/in_place", "x", "in_place", 1, ["r"], calib, 1000, 150)
    c = projection.check(p, calib, real, tolerance=0.2)
    assert c.fresh_share == 0
    measured = 0.02 + 150 * 0.0105 + 0.2 + 0.01
    assert c.measured_s.value == pytest.approx(measured)
    assert c.projected_full_s.value == pytest.approx(0.02 + 150 * 0.01 + 0.2 + 0.01)
    assert c.error_full == pytest.approx(c.projected_full_s.value / measured - 1)
    assert c.within


def test_project_from_an_earlier_run(tmp_path, env):
    out = tmp_path / "runs"
    cli("run", "--tasks", MINI, "--policy", "explorer", "--explorer-steps", "12", "--concurrency", "1",
        "--attempts", "6", "--duration", "5m", "--out", str(out), "--json", str(tmp_path / "r.json"), "--no-progress",
        env=env, check=True)
    run_id = json.loads((tmp_path / "r.json").read_text())["run_id"]
    proc = cli("project", "--from", run_id, "--trajectories", "1000000", "--steps", "150", "--out", str(out),
               "--json", str(tmp_path / "p.json"), env=env, check=True)
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["schema"] == "drumsbench.projection/1" and p["runs"] == [run_id]
    one, = p["projections"]
    assert one["label"] == "process/in_place" and one["terms"]["n"] == 6 and one["terms"]["mean_steps"] == 13
    per = one["terms"]["cold_start"]["value"] + 150 * one["terms"]["per_step"]["value"] + \
        one["terms"]["verify"]["value"]
    assert one["per_trajectory_s"]["value"] == pytest.approx(per)
    assert one["worker_hours"]["value"] == pytest.approx(per * 1_000_000 / 3600)
    assert one["worker_hours"]["low"] <= one["worker_hours"]["value"] <= one["worker_hours"]["high"]
    assert "worker-hours" in proc.stdout and "process/in_place" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("target,calibrate,check", [
    ("process", 12, 6),  # cheap steps, noisy host: six alternating rounds
    ("docker", 4, 2),  # ~0.1 s per step: two rounds keep the test near a minute
])
def test_projection_within_20_percent_of_real_150_step_trajectories(tmp_path, env, target, calibrate, check):
    """Calibrate on 30-step explorer trajectories, project 150 steps, run real 150-step ones, compare."""
    name = target.partition(":")[0]
    if name not in registry.names():
        pytest.skip(f"substrate {name} is not registered in this build")
    require(registry.get(name).missing())
    proc = cli("project", "--trajectories", "1000000", "--steps", "150", "--substrate", target,
               "--calibrate-attempts", str(calibrate), "--calibrate-steps", "30", "--check", str(check),
               "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "p.json"), env=env, check=True)
    p = json.loads((tmp_path / "p.json").read_text())
    one, = p["projections"]
    c = one["check"]
    assert c["n"] == check and c["mean_steps"] == 150, one["label"]
    assert c["paired"]["rounds"] == check  # calibration and real trajectories alternated
    assert abs(c["error"]) <= 0.20, f"{one['label']}: projected {c['projected_s']} vs measured {c['measured_s']}"
    assert c["within"] and p["checks_within"] is True
    assert one["worker_hours"]["value"] == pytest.approx(one["per_trajectory_s"]["value"] * 1_000_000 / 3600)
    assert "check against real trajectories" in proc.stdout
    # rebuilt from the ledger alone, the projection says the same
    cli("report", p["runs"][0], "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "again.json"),
        env=env, check=True)
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["projections"] == p["projections"]
    # published for the HTML report (docs/html-report.md), which renders it
    cli("report", p["runs"][0], "--out", str(tmp_path / "runs"), "--html", str(tmp_path / "p.html"),
        env=env, check=True)
    page = (tmp_path / "p.html").read_text()
    assert "Worker-hour projection" in page and one["label"] in page and "could not be rendered" not in page


@pytest.mark.parametrize("args,needle", [
    (["--steps", "0"], "--steps"),
    (["--trajectories", "0"], "--trajectories"),
    (["--substrate", "nosuch"], "unknown substrate"),
    (["--substrate", "process:snapshot"], "not 'snapshot'"),
    (["--from", "r1", "--check", "2"], "give one or the other"),
    (["--tolerance", "0"], "--tolerance"),
])
def test_bad_project_arguments_one_line_exit_2(tmp_path, env, args, needle):
    proc = cli("project", "--out", str(tmp_path / "runs"), *args, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_check_weighs_fresh_starts_like_the_real_runs():
    """Real trajectories that each start in a fresh sandbox are compared with fresh starts, not warm resets."""
    calib = [_row(0.5 if i % 4 == 0 else 0.0, 0.02, [0.01] * 30, 0.2) for i in range(8)]
    real = [_row(0.5, 0.02, [0.01] * 150, 0.2) for _ in range(2)]
    p = projection.project("x/in_place", "x", "in_place", 1, ["r"], calib, 1000, 150)
    c = projection.check(p, calib, real, tolerance=0.2)
    assert c.fresh_share == 1
    assert c.projected_full_s.value == pytest.approx(c.measured_s.value)
    assert p.per_trajectory_full_s.value == pytest.approx(c.measured_s.value - 0.5)  # steady state: no provision
