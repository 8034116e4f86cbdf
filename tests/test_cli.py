"""The command line as a user meets it: runs, reports, bad input, kill -9 and resume, gc."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drumsbench.core.outcome import InvalidCause

from helpers import MINI, ROOT, cli, one_task_suite


@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


def _one_line_error(proc, needle):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert needle in lines[-1], proc.stderr
    return lines[-1]


@pytest.mark.parametrize("args,needle", [
    (["--substrate", "nosuch"], "unknown substrate 'nosuch'"),
    (["--duration", "-5s"], "--duration"),
    (["--duration", "soon"], "not a duration"),
    (["--inject", "stale_generation"], "--inject"),
    (["--inject", "bogus=0.1"], "unknown cause 'bogus'"),
    (["--policy", "genius"], "unknown policy 'genius'"),
    (["--concurrency", "0"], "--concurrency"),
    (["--step-timeout", "10s", "--episode-timeout", "5s"], "--episode-timeout"),
    (["--tasks", "/nonexistent/suite"], "--tasks"),
])
def test_bad_input_one_line_exit_2(args, needle, tmp_path, env):
    proc = cli("run", "--tasks", MINI, "--out", str(tmp_path / "runs"), "--duration", "2s", *args, env=env)
    _one_line_error(proc, needle)
    # nothing half-written: a rejected run leaves no run in the ledger
    ledger = tmp_path / "runs" / "ledger.sqlite"
    if ledger.exists():
        assert sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_malformed_task_toml_and_unwritable_out(tmp_path, env):
    suite = tmp_path / "suite"
    subprocess.run(["cp", "-r", MINI, str(suite)], check=True)
    (suite / "add-sign" / "task.toml").write_text("id = [unclosed\n")
    _one_line_error(cli("run", "--tasks", str(suite), "--out", str(tmp_path / "r"), env=env), "not valid TOML")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_error(cli("run", "--tasks", MINI, "--out", str(blocker / "sub"), env=env), "--out")
    _one_line_error(cli("report", "nosuchrun", "--out", str(tmp_path / "empty"), env=env), "no ledger")


def _symlink_to_a_host_folder(suite: Path, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("the host's\n")
    os.symlink(host, suite / "projects" / "textstats" / "textstats" / "host")


def _task_toml_not_utf8(suite: Path, tmp_path: Path) -> None:
    toml = suite / "textstats-empty-summary" / "task.toml"
    toml.write_bytes(toml.read_bytes().replace(b"description = \"", b"description = \"\xe9t\xe9 "))


@pytest.mark.parametrize("damage,needle", [(_symlink_to_a_host_folder, "a symlink to"),
                                           (_task_toml_not_utf8, "not UTF-8 text")])
def test_a_task_folder_pointing_outside_or_not_utf8_is_one_line_exit_2(damage, needle, tmp_path, env):
    """A suite whose project links to a host folder, or whose task.toml is not UTF-8, is refused by
    every command that reads it: one line naming the file, exit 2, no traceback, nothing run."""
    suite = one_task_suite(tmp_path)
    damage(suite, tmp_path)
    out = tmp_path / "runs"
    for args in (["tasks", "list", str(suite)], ["tasks", "fingerprint", str(suite)],
                 ["tasks", "check", str(suite), "--substrate", "process"],
                 ["run", "--tasks", str(suite), "--out", str(out), "--duration", "2s"]):
        line = _one_line_error(cli(*args, env=env), needle)
        assert str(suite) in line, line
    ledger = out / "ledger.sqlite"
    assert not ledger.exists() or sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0


def test_injection_over_400_attempts(tmp_path, env):
    """5 % of each cause: every injected attempt is invalid with that cause, no other attempt is invalid."""
    inject = ",".join(f"{c.value}=0.05" for c in InvalidCause)
    out = tmp_path / "runs"
    proc = cli("run", "--tasks", "coding", "--policy", "noisy", "--concurrency", "2", "--attempts", "400",
               "--duration", "20m", "--step-timeout", "1s", "--episode-timeout", "2.5s", "--inject", inject,
               "--out", str(out), "--json", str(tmp_path / "r.json"), "--no-progress", env=env, check=True)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "drumsbench.run-report/1"
    assert report["attempts"] == 400
    assert report["invalid_not_injected"] == 0, proc.stdout
    for cause in InvalidCause:
        assert report["injected"][cause.value] > 0, f"no {cause} drawn in 400 attempts"
        assert report["injected_caught"][cause.value] == report["injected"][cause.value], cause
        assert report["invalid"][cause.value] == report["injected"][cause.value], cause
    assert report["invalid_total"] == sum(report["injected"].values())
    assert report["valid"] == report["success"] + report["failed"] == 400 - report["invalid_total"]
    assert report["isolation_confirmed"] is True
    # the ledger agrees attempt by attempt
    db = sqlite3.connect(out / "ledger.sqlite")
    rows = db.execute("SELECT injected, outcome, cause, reward FROM attempts").fetchall()
    assert all((inj is None) == (outcome != "invalid") for inj, outcome, _, _ in rows)
    assert all(cause == inj and reward is None for inj, outcome, cause, reward in rows if inj)
    # the report can be rebuilt from the ledger alone and says the same
    rebuilt = cli("report", report["run_id"], "--out", str(out), "--json", str(tmp_path / "again.json"),
                  env=env, check=True)
    again = json.loads((tmp_path / "again.json").read_text())
    for key in ("attempts", "valid", "invalid", "injected", "success", "failed", "host_seconds"):
        assert again[key] == report[key], key
    assert "stale_generation" in rebuilt.stdout


def _count(ledger: Path) -> int:
    try:
        return sqlite3.connect(ledger, timeout=5).execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_kill_9_then_gc_then_resume(tmp_path, env):
    out = tmp_path / "runs"
    ledger = out / "ledger.sqlite"
    full_env = {**os.environ, **env}
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "run", "--tasks", "coding", "--policy", "noisy",
                             "--concurrency", "2", "--attempts", "150", "--duration", "10m", "--out", str(out),
                             "--no-progress"], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.monotonic() + 120
    while _count(ledger) < 40 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    db = sqlite3.connect(ledger)
    before = db.execute("SELECT seq, outcome, t_end FROM attempts ORDER BY seq").fetchall()
    run_id = db.execute("SELECT run_id FROM runs").fetchone()[0]
    assert len(before) >= 40 and db.execute("SELECT status FROM runs").fetchone()[0] == "running"

    # the killed run left sandbox folders; gc removes them
    from drumsbench.substrates.process import sandbox_root

    sandboxes = sandbox_root(Path(env["DRUMSBENCH_STATE"]), run_id)  # where the sandbox uids reach it
    assert sandboxes.exists() and any(sandboxes.iterdir())
    gc = cli("gc", env=env, check=True)
    assert "1 dead run" in gc.stdout
    assert not sandboxes.exists()
    assert sqlite3.connect(ledger).execute("SELECT status FROM runs").fetchone()[0] == "interrupted"

    cli("run", "--resume", run_id, "--out", str(out), "--no-progress", env=env, check=True)
    after = sqlite3.connect(ledger).execute("SELECT seq, outcome, t_end FROM attempts ORDER BY seq").fetchall()
    assert set(before) <= set(after), "an attempt recorded before the kill was lost or changed"
    seqs = [r[0] for r in after]
    assert len(seqs) == len(set(seqs)) == 150
    rep = cli("report", run_id, "--out", str(out), "--json", str(tmp_path / "r.json"), env=env, check=True)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["attempts"] == 150 and data["segments"] == 2 and data["status"] == "complete"
    assert rep.returncode == 0
    again = cli("run", "--resume", run_id, "--out", str(out), env=env)
    assert again.returncode == 2 and "already complete" in again.stderr


def test_default_run_is_short_and_reports(tmp_path, env):
    proc = cli("run", "--duration", "3s", "--out", str(tmp_path / "runs"), env=env, check=True)
    for needle in ("valid rollouts per", "USD per valid rollout", "positive", "policy_unavailable", "p95"):
        assert needle in proc.stdout, needle
    # the ledger holds every action (an oracle's are the answer key): its owner's alone, -wal and -shm too
    files = sorted((tmp_path / "runs").glob("ledger.sqlite*"))
    assert files and {f.name for f in files} <= {"ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"}
    assert [(f.name, oct(f.stat().st_mode & 0o077)) for f in files] == [(f.name, "0o0") for f in files]
    assert (tmp_path / "runs").stat().st_mode & 0o077 == 0  # the out folder it made, with every artifact


def test_main_job_needs_no_test_extra(tmp_path, env):
    """`make run` installs the package without extras, and the main job imports none of them: no Ray,
    torch, OpenEnv, linters or test runner are needed to run `drumsbench run` on the default."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    heavy = ("ray", "torch", "openenv", "gymnasium", "mypy", "ruff", "pytest", "docker")
    assert not [h for h in heavy if h in core], core
    make = (ROOT / "Makefile").read_text()
    run_install = make.split("$(VENV)/.installed-run:")[1].split("\n\n")[0]
    assert "pip install -q -e ." in run_install and "[" not in run_install, run_install
    probe = ("import sys; from drumsbench.cli import main; sys.argv = ['drumsbench', 'run', '--duration', '2s', "
             f"'--out', {str(tmp_path / 'runs')!r}, '--no-progress']\n"
             "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})\n"
             "print('HEAVY', bad)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=tmp_path)
    assert "HEAVY []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_ctrl_c_stops_cleanly(tmp_path, env):
    from drumsbench.substrates.hostproc import pids_with_env

    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "drumsbench", "run", "--tasks", "coding", "--policy", "explorer",
                             "--explorer-steps", "30", "--duration", "5m", "--out", str(out), "--no-progress"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            text=True)
    deadline = time.monotonic() + 60
    while _count(out / "ledger.sqlite") < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "attempts" in stdout  # the report of what was done is still printed
    db = sqlite3.connect(out / "ledger.sqlite")
    run_id, status = db.execute("SELECT run_id, status FROM runs").fetchone()
    assert status == "interrupted"
    assert not (Path(env["DRUMSBENCH_STATE"]) / "sandboxes" / run_id).exists()
    assert not pids_with_env("DRUMSBENCH_RUN", run_id)
