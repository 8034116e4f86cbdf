"""`drumsbench chaos`: one test per event at a small size, real processes and substrates, and
positive controls showing the checks fail on a ledger that lost an attempt, counted one twice or
misclassified one (each made by really changing rows of a chaos run's ledger)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import ChaosEventArtifact, ChaosSummaryArtifact, load
from drumsbench.measure.chaos import INFRA_CAUSES
from drumsbench.substrates import registry

from conftest import require
from helpers import cli


@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


def chaos(out: Path, env: dict[str, str], *args: str, expect: int = 0) -> tuple[str, list[ChaosEventArtifact],
                                                                                ChaosSummaryArtifact]:
    proc = cli("chaos", "--out", str(out), "--concurrency", "2", "--seed", "1", "--no-progress", *args, env=env,
               timeout=240)
    assert proc.returncode == expect, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ledger = Ledger(out / "ledger.sqlite")
    try:
        run_id = ledger.runs()[-1]
        events = sorted(load(ledger, run_id, ChaosEventArtifact).values(), key=lambda e: e.index)
        summary = load(ledger, run_id, ChaosSummaryArtifact)["summary"]
    finally:
        ledger.close()
    for name in ("survived", "counted_once", "classified", "ledger_intact", "gc_clean", "harness"):
        assert f" {name}: " in proc.stdout, proc.stdout
    return run_id, events, summary


def check_again(out: Path, run_id: str, env: dict[str, str]) -> str:
    proc = cli("chaos", "--check", run_id, "--out", str(out), env=env, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


def copy_ledger(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    a, b = sqlite3.connect(src / "ledger.sqlite"), sqlite3.connect(dest / "ledger.sqlite")
    a.backup(b)
    a.close()
    b.close()


def test_harness_kill_then_resume_loses_nothing_and_the_check_catches_a_lost_or_doubled_attempt(tmp_path, env):
    out = tmp_path / "chaos"
    run_id, events, summary = chaos(out, env, "--events", "harness_kill", "--duration", "12s", "--every", "3s")
    assert summary.passed and summary.events >= 2, summary
    resumed = [e for e in events if "resumed (start" in e.followed]  # a kill after the run's end resumes nothing
    assert len(resumed) >= 2 and summary.harness_starts == len(resumed) + 1, [e.followed for e in events]
    db = sqlite3.connect(out / "ledger.sqlite")
    # every start records a segment, but one that finds the run's time used up completes it without one
    segments = db.execute("SELECT COUNT(*) FROM segments").fetchone()[0]
    assert summary.harness_starts - 1 <= segments <= summary.harness_starts, (segments, summary.harness_starts)
    assert db.execute("SELECT status FROM runs").fetchone()[0] == "complete"
    kill = next(e for e in events if e.before.n > 0)
    final = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    assert final > kill.before.n, "the resumed run recorded nothing after the kill"
    db.close()

    # positive control 1: really delete a row recorded before a kill -> survived fails
    lost = tmp_path / "lost"
    copy_ledger(out, lost)
    with sqlite3.connect(lost / "ledger.sqlite") as db:
        seq = db.execute("SELECT MIN(seq) FROM attempts").fetchone()[0]
        db.execute("DELETE FROM attempts WHERE seq = ?", (seq,))
    text = check_again(lost, run_id, env)
    assert "FAIL survived" in text and "lost" in text, text
    assert "ok   counted_once" in text

    # positive control 2: the same attempt recorded again under a new seq -> counted_once fails
    twice = tmp_path / "twice"
    copy_ledger(out, twice)
    with sqlite3.connect(twice / "ledger.sqlite") as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(attempts)")]
        top = db.execute("SELECT MAX(seq) FROM attempts").fetchone()[0]
        picked = ", ".join("? " if c == "seq" else c for c in cols)
        db.execute(f"INSERT INTO attempts ({', '.join(cols)}) SELECT {picked} FROM attempts WHERE seq = ?",
                   (top + 1, kill.before.max_seq))
    text = check_again(twice, run_id, env)
    assert "FAIL counted_once" in text and "recorded twice" in text, text


def test_sandbox_kill_attempts_are_classified_and_a_wrong_cause_is_caught(tmp_path, env):
    out = tmp_path / "chaos"
    run_id, events, summary = chaos(out, env, "--events", "sandbox_kill", "--policy", "explorer",
                                    "--duration", "12s", "--every", "2s")
    assert summary.passed, summary
    hit = [e for e in events if e.target != "none"]
    assert hit, [e.followed for e in events]
    # positive control: an attempt in flight at a kill made invalid with a cause no kill can have
    db = sqlite3.connect(out / "ledger.sqlite")
    seqs = [r[0] for e in hit for r in db.execute(
        "SELECT seq FROM attempts WHERE t_start <= ? AND ? <= t_end", (e.t, e.t))]
    assert seqs, "no attempt was in flight at any kill"
    with db:
        db.execute("UPDATE attempts SET outcome = 'invalid', cause = 'stale_generation', reward = NULL "
                   "WHERE seq = ?", (seqs[0],))
    db.close()
    text = check_again(out, run_id, env)
    assert "FAIL classified" in text and "stale_generation" in text, text


def test_a_reader_holding_the_ledger_does_not_stop_the_run(tmp_path, env):
    out = tmp_path / "chaos"
    _, events, summary = chaos(out, env, "--events", "ledger_reader", "--hold", "2s", "--duration", "10s",
                               "--every", "3s")
    assert summary.passed and events, summary
    # attempts were recorded while the reader held its transaction
    first = events[0]
    assert first.hold_s == 2.0 and "meanwhile" in first.followed
    assert first.attempts_after is not None and first.attempts_after > first.before.n, first


def test_the_report_of_a_chaos_run_shows_its_checks_and_events(tmp_path, env):
    """`drumsbench report` on a chaos run's ledger: the run's report, then the chaos verdict; the HTML page
    has a chaos section whose keyed verdicts are the stored checks, and one row per event."""
    import re

    out = tmp_path / "chaos"
    run_id, events, summary = chaos(out, env, "--events", "ledger_reader,sandbox_kill", "--hold", "1s",
                                    "--duration", "8s", "--every", "2s")
    page = tmp_path / "page.html"
    proc = cli("report", run_id, "--out", str(out), "--html", str(page), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"chaos {run_id}: {summary.events} events" in proc.stdout and "chaos: passed" in proc.stdout, proc.stdout
    html = page.read_text()
    assert 'id="chaos"' in html
    keyed = dict(re.findall(rf'data-key="{re.escape(run_id)}/chaos/(\w+)"><b class="(\w+)"', html))
    assert keyed == {name: "ok" if c.passed else "bad" for name, c in summary.checks.items()}, keyed
    section = html[html.index('id="chaos"'):html.index("</section>", html.index('id="chaos"'))]
    assert section.count("<tr>") == 2 + len(summary.checks) + len(events), section[:2000]  # 2 header rows
    for e in events:
        assert e.kind in section and str(e.before.n) in section


def test_a_full_out_folder_stops_the_run_cleanly_and_resume_loses_nothing(tmp_path, env):
    if os.geteuid() != 0:
        pytest.skip("mounting the tmpfs out folder needs root")
    out = tmp_path / "chaos"
    _, events, summary = chaos(out, env, "--events", "disk_full", "--tmpfs-mib", "16", "--duration", "10s",
                               "--every", "3s")
    assert summary.passed and events, summary
    stopped = [e for e in events if e.harness_exit is not None]
    assert stopped, [e.followed for e in events]
    for e in stopped:
        assert e.harness_exit == 2 and e.integrity == "ok", e  # one-line error, never a traceback
        assert "the ledger refused attempt" in e.followed and "resumed" in e.followed
    assert not (out / "live").exists() and str(out) not in Path("/proc/self/mounts").read_text()


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_container_kill_is_classified(tmp_path, env, engine):
    """docker: `docker kill` of a container of the run makes its attempt invalid with an infrastructure
    cause. podman: SIGKILL of a container's conmon (its monitor) leaves the container running, so its
    attempt may end valid; whatever is invalid carries an infrastructure cause, and gc removes the
    container whose monitor is gone."""
    require(registry.get(engine).missing())
    out = tmp_path / "chaos"
    run_id, events, summary = chaos(out, env, "--substrate", engine, "--events", "container_kill",
                                    "--duration", "15s", "--every", "4s")
    prefix = "container" if engine == "docker" else "conmon pid"
    assert summary.passed and any(e.target.startswith(prefix) for e in events), summary
    db = sqlite3.connect(out / "ledger.sqlite")
    causes = {r[0] for r in db.execute("SELECT cause FROM attempts WHERE cause IS NOT NULL")}
    assert causes <= {c.value for c in INFRA_CAUSES}, causes  # e.g. killed mid-verification
    # the oracle solves every task: a 0 would be a kill taken for the policy's doing (the race of an
    # exec ending 137 before the daemon records the stop once gave one; the classified check catches it)
    assert not db.execute("SELECT COUNT(*) FROM attempts WHERE outcome = 'failed'").fetchone()[0]
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] >= 2
    if engine == "podman":
        return
    assert causes, "no docker kill made an attempt invalid"
    # positive control: a hit attempt scored 0 instead
    seq = next(r[0] for e in events for r in db.execute(
        "SELECT seq FROM attempts WHERE t_start <= ? AND ? <= t_end", (e.t, e.t)))
    with db:
        db.execute("UPDATE attempts SET outcome = 'failed', cause = NULL, reward = 0.0 WHERE seq = ?", (seq,))
    db.close()
    text = check_again(out, run_id, env)
    assert "FAIL classified" in text and f"seq {seq} of the oracle policy scored 0" in text, text


def test_killing_soffice_or_xvfb_makes_the_desktop_attempt_invalid(tmp_path, env):
    from drumsbench.envs.desktop import instance

    require(instance.missing())
    out = tmp_path / "chaos"
    _, events, summary = chaos(out, env, "--tasks", "desktop", "--events", "desktop_kill", "--duration", "15s",
                               "--every", "5s")
    assert summary.passed and any(e.target != "none" for e in events), summary
    db = sqlite3.connect(out / "ledger.sqlite")
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome = 'invalid'").fetchone()[0] >= 1


def test_disk_full_without_a_tmpfs_is_refused(tmp_path, env):
    proc = cli("chaos", "--events", "disk_full", "--out", str(tmp_path / "c"), env=env, timeout=60)
    assert proc.returncode == 2 and "--tmpfs-mib" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_vm_kill_makes_its_attempt_invalid_with_an_infrastructure_cause(tmp_path, env):
    """A killed QEMU serving an attempt makes that attempt invalid with an infrastructure cause, or,
    when it died while the attempt was still being reset (before the policy acted), the reset says so
    and a fresh VM serves it. The event's t is the kill's own moment: the attempts in flight then
    (and each one's successor on its worker, for a kill just after a verdict) are the ones it hit."""
    require(registry.get("vm").missing())
    out = tmp_path / "chaos"
    _, events, summary = chaos(out, env, "--substrate", "vm", "--events", "vm_kill", "--duration", "25s",
                               "--every", "8s")
    assert summary.passed, summary
    hit = [e for e in events if e.target.startswith("pid") and "qemu-system" in e.target]
    assert hit, [(e.target, e.followed) for e in events]
    db = sqlite3.connect(out / "ledger.sqlite")
    rows = db.execute("SELECT seq, worker, outcome, cause, t_start, t_end, extra FROM attempts").fetchall()
    causes = {c for _, _, o, c, *_ in rows if o == "invalid"}
    assert causes and causes <= {x.value for x in INFRA_CAUSES}, causes

    def touched(t: float) -> list[tuple[int, str, str | None, bool]]:
        in_flight = [r for r in rows if r[4] <= t <= r[5]]
        after = [min((r for r in rows if r[1] == w and r[4] >= end), key=lambda r: r[4], default=None)
                 for _, w, _, _, _, end, _ in in_flight]
        return [(r[0], r[2], r[3], "reset_in_place_failed" in json.loads(r[6]))
                for r in in_flight + [a for a in after if a is not None]]

    seen = {e.index: touched(e.t) for e in hit}
    accounted = [i for i, rs in seen.items() if any(o == "invalid" or reset for _, o, _, reset in rs)]
    assert accounted, seen


def _daemons() -> dict[str, list[int]]:
    """Pids of dockerd and of the containerd it manages (not the containers' shims)."""
    import subprocess

    found: dict[str, list[int]] = {"dockerd": [], "containerd": []}
    for name in found:
        out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, timeout=30).stdout
        found[name] = [int(p) for p in out.split()]
    return found


def test_dockerd_killed_and_restarted_mid_run_is_classified_and_docker_answers_again(tmp_path, env):
    """`daemon_kill` (opt-in): SIGKILL of dockerd mid-run, the same command line started again. Every
    attempt hit ends invalid with an infrastructure cause (or succeeded before the kill), the checks
    pass, docker answers after, and one dockerd with one containerd is left, started as before."""
    import subprocess

    require(registry.get("docker").missing())
    before = _daemons()
    argv = Path(f"/proc/{before['dockerd'][0]}/cmdline").read_bytes()
    out = tmp_path / "chaos"
    _, events, summary = chaos(out, env, "--substrate", "docker", "--events", "daemon_kill", "--duration", "20s",
                               "--every", "8s")
    assert summary.passed, summary
    hit = [e for e in events if e.target.startswith("dockerd pid")]
    assert hit and all("answered again" in e.followed for e in hit), [(e.target, e.followed) for e in hit]
    assert subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    after = _daemons()
    assert len(after["dockerd"]) == 1 and len(after["containerd"]) <= max(1, len(before["containerd"])), after
    assert Path(f"/proc/{after['dockerd'][0]}/cmdline").read_bytes() == argv
    db = sqlite3.connect(out / "ledger.sqlite")
    causes = {r[0] for r in db.execute("SELECT cause FROM attempts WHERE cause IS NOT NULL")}
    assert causes <= {c.value for c in INFRA_CAUSES}, causes
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome = 'success'").fetchone()[0] > 0


def test_machine_wide_events_must_be_named_and_fit_the_substrate(tmp_path, env):
    from drumsbench.experiments.chaos import applicable

    assert "daemon_kill" not in applicable("docker", "coding", tmpfs=True)
    assert "vm_kill" in applicable("vm", "coding", tmpfs=False)
    for args, flag in ((["--events", "vm_kill"], "--substrate vm"),
                       (["--events", "daemon_kill"], "--substrate docker")):
        proc = cli("chaos", *args, "--out", str(tmp_path / "c"), env=env, timeout=60)
        assert proc.returncode == 2 and flag in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_a_socket_someone_listens_on_is_not_left_behind(tmp_path):
    """gc_clean counts a new /tmp socket only when nothing listens on it (another user's live LibreOffice
    keeps its pipe open; one of a dead process refuses the connection)."""
    import socket

    from drumsbench.experiments.chaos import listening

    path = str(tmp_path / "OSL_PIPE_0_test")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        assert listening(path)
    finally:
        srv.close()
    assert os.path.exists(path) and not listening(path)  # the file stays, nobody answers
    (tmp_path / "plain").write_text("x")
    assert not listening(str(tmp_path / "plain")) and not listening(str(tmp_path / "absent"))


def test_a_control_whose_sandbox_dies_is_not_fired_instead_of_stopping_the_run(tmp_path):
    """The isolation control on a substrate whose sandboxes fail (here: every sandbox handed out is already
    destroyed, as after a kill from outside): recorded as not fired, with the reason — never an exception that
    stops the run (a chaos container kill during a window's control stopped the harness)."""
    from drumsbench.rollout.isolation import positive_control
    from drumsbench.substrates.process import ProcessSubstrate

    sub = ProcessSubstrate("r-control", tmp_path / "state")
    made = []
    create = sub.create

    def dying_create():
        box = create()
        made.append(box)
        box.destroy()  # the sandbox is gone from under the harness (as after a kill from outside)
        return box

    sub.create = dying_create
    try:
        result = positive_control(sub)
    finally:
        sub.close()
    assert not result.fired and result.detail.startswith("could not run"), result
    assert len(made) >= 2  # tried again with new sandboxes
