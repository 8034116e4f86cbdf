"""The desktop environment (LibreOffice under Xvfb) on the process substrate.

Controls on every desktop task (oracle succeeds, null and the wrong plans fail, all valid), the
gates that matter for a desktop (black and frozen screens, stale locks, a dialog that swallows
input, LibreOffice gone at verification), screenshots kept for people, and no Xvfb / soffice left
behind after a run, an interrupted run, or ``drumsbench gc`` after a ``kill -9``.

All tests share the cached template profile; each attempt starts its own instance (about 2 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from drumsbench.core.errors import InvalidAttempt, UsageError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs import suites
from drumsbench.envs.base import Action, ActionSpec
from drumsbench.envs.desktop import odf
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.task import compute_fingerprints, load_suite, lock_name
from drumsbench.policies import replay
from drumsbench.policies.scripted import Null, Oracle, Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.process import ProcessSubstrate

CFG = RolloutConfig(step_timeout_s=20, episode_timeout_s=120)
TASKS = [t.id for t in load_suite("desktop")]
DESKTOP_COMMS = {"Xvfb", "soffice.bin", "oosplash", "openbox", "unshare"}


# -- helpers ------------------------------------------------------------------------------------------
def desktop_processes(marker: str) -> list[str]:
    """Live processes (not zombies) whose environment mentions ``marker`` (the test's state folder),
    except this test process: every Xvfb, openbox, soffice and holder an instance of ours started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        state = stat.rsplit(")", 1)[1].split()[0]
        if state == "Z" or marker.encode() not in environ:
            continue
        found.append(f"{entry} {stat[stat.index('(') + 1:stat.rindex(')')]}")
    return found


def wait_for(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def slot(desktop_ready, state_dir, run_id, tmp_path):
    sub = ProcessSubstrate(run_id, state_dir)
    s = Slot(sub, DesktopEnv(artifact_dir=tmp_path / "report"))
    yield s
    s.destroy()
    assert isinstance(s.env, DesktopEnv)
    s.env.stop()
    sub.close()
    assert desktop_processes(str(state_dir)) == []
    assert sub.leftovers() == []


def attempt(slot: Slot, task_id: str, policy: Policy, *, seq: int = 0, fault: InvalidCause | None = None,
            cfg: RolloutConfig = CFG):
    task = next(t for t in load_suite("desktop") if t.id == task_id)
    return run_attempt(slot, task, policy, cfg, CanaryRegistry(), run_id=slot.substrate.run_id, seq=seq,
                       seed=0, fault=fault)


class Wrong(Policy):
    name = "wrong"

    def __init__(self, choice: int) -> None:
        super().__init__()
        self.choice = choice

    def plan(self, task, rng):
        return task.wrong_plan(self.choice)


# -- the suite, without LibreOffice -------------------------------------------------------------------
def test_suite_is_a_desktop_suite_with_writer_and_calc_tasks():
    suite = suites.load("desktop")
    assert suite.kind == "desktop" and suite.make_env is DesktopEnv
    assert len(suite.tasks) >= 8
    assert {t.app for t in suite.tasks} == {"writer", "calc"}
    for t in suite.tasks:
        assert t.oracle_plan()[-1].kind == "submit" and len(t.oracle_plan()) > 1
        assert t.wrong_choices >= 1 and t.wrong_plan(0)[-1].kind == "submit"
        assert t.check.strip().startswith((b"def check", b"import", b"BOLD"))
    assert compute_fingerprints("desktop") == {t.id: t.start_fingerprint for t in suite.tasks}


def test_start_documents_are_deterministic():
    body = "<text:p>Same bytes twice.</text:p>"
    assert odf.build("writer", body) == odf.build("writer", body)
    assert odf.build("writer", body) != odf.build("writer", body + "<text:p/>")
    assert odf.build("calc", "<table:table/>")[30:38] == b"mimetype"


def test_a_wrong_fingerprint_is_refused_with_the_fix(tmp_path):
    import shutil

    src = Path(suites.__file__).parents[1] / "tasks" / "desktop"
    dst = tmp_path / "suite"
    shutil.copytree(src, dst)
    spec = dst / "writer-fix-typo" / "task.toml"
    spec.write_text(spec.read_text().replace("Teh report", "Teh reports"))
    with pytest.raises(UsageError, match=r"start_fingerprint.*update it"):
        load_suite(str(dst))


def test_replay_recordings_round_trip(tmp_path):
    acts = [ActionSpec("key", {"keys": "ctrl+b"}), ActionSpec("type", {"text": "x"}), ActionSpec("submit")]
    path = tmp_path / "rec.json"
    replay.save(path, acts)
    assert replay.load(path) == acts[:2]
    replay.save(path, {"writer-fix-typo": acts})
    assert replay.load(path) == {"writer-fix-typo": acts[:2]}
    path.write_text(json.dumps({"actions": [{"payload": {}}]}))
    with pytest.raises(UsageError, match="kind"):
        replay.load(path)
    with pytest.raises(UsageError, match="no actions for task"):
        replay.Replay({"other": acts}).begin(load_suite("desktop")[0], None)  # type: ignore[arg-type]


# -- controls on every task ----------------------------------------------------------------------------
@pytest.mark.parametrize("task_id", TASKS)
def test_oracle_succeeds_null_and_wrong_plans_fail(slot, task_id):
    oracle = attempt(slot, task_id, Oracle(), seq=0)
    assert oracle.outcome is Outcome.SUCCESS, oracle.detail
    null = attempt(slot, task_id, Null(), seq=1)
    assert null.outcome is Outcome.FAILED, null.detail
    wrong = attempt(slot, task_id, Wrong(0), seq=2)
    assert wrong.outcome is Outcome.FAILED, wrong.detail


def test_screenshots_are_kept_per_task(slot, tmp_path):
    rec = attempt(slot, "writer-fix-typo", Oracle())
    assert rec.outcome is Outcome.SUCCESS, rec.detail
    folder = tmp_path / "report" / "screenshots" / slot.substrate.run_id / "writer-fix-typo"
    shots = {p: (folder / f"{p}.png").read_bytes() for p in ("start", "middle", "end")}
    assert all(b.startswith(b"\x89PNG\r\n\x1a\n") and len(b) > 2000 for b in shots.values())
    assert shots["start"] != shots["end"]  # the typo was fixed on screen
    titles = json.loads((folder / "titles.json").read_text())
    assert titles["start"] == "start.odt - LibreOffice Writer"


def test_replay_of_a_recorded_episode_succeeds(slot, tmp_path):
    first = attempt(slot, "calc-sum-formula", Oracle())
    assert first.outcome is Outcome.SUCCESS, first.detail
    env = slot.env
    assert isinstance(env, DesktopEnv) and env.history
    path = tmp_path / "episode.json"
    replay.save(path, {"calc-sum-formula": env.history})
    again = attempt(slot, "calc-sum-formula", replay.Replay(path), seq=1)
    assert again.outcome is Outcome.SUCCESS, again.detail
    # a prefix replayed, then a policy of choice continues: the shape branching uses
    prefix = replay.Replay(env.history[:1], then=Null())
    assert attempt(slot, "calc-sum-formula", prefix, seq=2).outcome is Outcome.FAILED


# A policy's shell action that asks LibreOffice (UNO, no authentication) to run a command: as root,
# that would be a sandbox escape (and a way to kill Xvfb: an escape into invalid). It writes a marker
# named by its argument; a marker owned by root proves LibreOffice ran it.
UNO_EXEC = ("import os, sys, uno\n"
            "ctx = uno.getComponentContext()\n"
            "r = ctx.ServiceManager.createInstanceWithContext('com.sun.star.bridge.UnoUrlResolver', ctx)\n"
            "remote = r.resolve('uno:socket,host=127.0.0.1,port=2002;urp;StarOffice.ComponentContext')\n"
            "sse = remote.ServiceManager.createInstanceWithContext('com.sun.star.system.SystemShellExecute', remote)\n"
            "sse.execute('/usr/bin/touch', os.path.abspath(sys.argv[1]), 1)\n"
            "print('UNO REACHED')\n")


def test_a_shell_action_cannot_reach_libreoffice_or_the_x_server(slot):
    """The shell action runs without the instance's network (LibreOffice's UNO listener) and with the
    instance's sockets covered. Positive control: the same program entered into the instance's network
    namespace as the same uid (how shell actions ran before) makes LibreOffice run a command as root."""
    import shlex

    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    slot.provision()
    env = slot.env
    assert isinstance(env, DesktopEnv)
    env.reset(task)
    inst = env.instance
    work = Path(inst.work)
    probe = (f"python3 -c {shlex.quote(UNO_EXEC)} blocked; ls -A /tmp/.X11-unix; "
             "for s in /tmp/OSL_PIPE_*; do [ -S \"$s\" ] && echo \"socket $s\"; done; echo end")
    obs = env.step(Action.of(ActionSpec("shell", {"command": probe}), env.generation), 30)
    result = obs.content["result"]
    assert "UNO REACHED" not in result["stdout"] and "NoConnectException" in result["stderr"], result
    assert result["stdout"].strip() == "end", result  # no X socket, no LibreOffice pipe in its view
    time.sleep(1.0)
    assert not (work / "blocked").exists()
    # positive control: the instance's network namespace, the same uid
    uid = slot.sandbox.uid if slot.sandbox is not None else None
    assert uid is not None
    old = ["nsenter", "-t", str(inst.holder_pid), "-m", "-n", "-u", "-i", "-p", f"--setuid={uid}", f"--setgid={uid}",
           "--", "env", "-C", inst.inside(work), "python3", "-c", UNO_EXEC, "reached"]
    res = inst.box.exec_launcher(old, timeout=30, cwd=inst.box.paths.work, env={"HOME": inst.inside(inst.home)},
                                 stdin=None, output_limit=65536)
    assert b"UNO REACHED" in res.stdout, res
    wait_for(lambda: (work / "reached").exists(), 10, "LibreOffice's command")
    # run by LibreOffice as the sandbox's second uid (before: as root); never the policy's commands' uid
    assert inst.app_ids is not None
    assert (work / "reached").stat().st_uid == inst.app_ids[0] != uid


def test_closing_libreoffice_is_the_policys_doing_not_an_infrastructure_fault(slot):
    # An empty (black) desktop after the policy quit LibreOffice is a valid observation, and the
    # verifier says "not done" (failed, reward 0) instead of "could not run" (invalid).
    quit_ = [ActionSpec("key", {"keys": "ctrl+q"}), ActionSpec("wait", {"seconds": 1.5})]
    rec = attempt(slot, "writer-fix-typo", replay.Replay(quit_))
    assert rec.outcome is Outcome.FAILED, rec.detail
    # a check that reads only the stored file still passes after the policy saved and quit
    task = next(t for t in load_suite("desktop") if t.id == "writer-save-docx")
    rec = attempt(slot, "writer-save-docx", replay.Replay(task.oracle_plan()[:-1] + quit_), seq=1)
    assert rec.outcome is Outcome.SUCCESS, rec.detail


def test_capture_of_a_replayed_prefix_is_faithful_and_a_file_copy_is_not(slot, state_dir):
    task = next(t for t in load_suite("desktop") if t.id == "writer-bold-word")
    parent = slot.env
    assert isinstance(parent, DesktopEnv)
    slot.provision()
    parent.reset(task)
    for spec in task.branch_prefix(3):
        parent.step(Action.of(spec, parent.generation), 20)
    prepared = parent.capture()
    assert prepared["text"] == "Only verified rollouts count." and prepared["locks"] == {".~lock.start.odt#": "own"}
    replayed = DesktopEnv()
    copied = DesktopEnv()
    boxes = [slot.substrate.create(), slot.substrate.create()]
    try:
        replayed.attach(boxes[0])
        replayed.reset(task)
        for spec in task.branch_prefix(3):
            replayed.step(Action.of(spec, replayed.generation), 20)
        assert all(replayed.compare(prepared, replayed.capture()).values())
        # a file copy carries the parent's lock (foreign here) and loses the unsaved typing
        copied.attach(boxes[1])
        src, dst = parent.instance.work, Path(boxes[1].paths.work)
        for f in src.iterdir():
            (dst / f.name).write_bytes(f.read_bytes())
        copied.resume(task)
        dims = copied.compare(prepared, copied.capture())
        assert dims["locks"] and dims["title"] and not dims["text"] and not dims["undo"], dims
    finally:
        for env, box in ((replayed, boxes[0]), (copied, boxes[1])):
            env.stop()
            box.destroy()


# -- gates ---------------------------------------------------------------------------------------------
def test_black_screen_is_a_bad_observation(slot):
    rec = attempt(slot, "writer-fix-typo", Oracle(), fault=InvalidCause.BAD_OBSERVATION)
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.BAD_OBSERVATION), rec.detail
    assert "black screen" in rec.detail and rec.reward is None


def test_frozen_screen_is_a_bad_observation(slot):
    assert isinstance(slot.env, DesktopEnv)
    slot.env.observation_fault = "frozen"  # SIGSTOP the X server instead of blanking it
    rec = attempt(slot, "calc-sum-formula", Oracle(), fault=InvalidCause.BAD_OBSERVATION)
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.BAD_OBSERVATION), rec.detail
    assert "frozen" in rec.detail
    after = attempt(slot, "calc-sum-formula", Oracle(), seq=1)  # the stopped instance is gone
    assert after.outcome is Outcome.SUCCESS, after.detail


def test_planted_stale_lock_is_a_dirty_reset_never_opened_read_only(slot, monkeypatch):
    from drumsbench.core.errors import InvalidAttempt
    from drumsbench.rollout import gates

    env = slot.env
    assert isinstance(env, DesktopEnv)
    env.plant_stale_lock = True
    details: dict = {}
    check_reset = gates.check_reset

    def check_and_look(e, task):  # what gate 1 saw, read before the invalid attempt's sandbox goes
        try:
            check_reset(e, task)
        except InvalidAttempt:
            details.update(env.fingerprint_details())
            raise

    monkeypatch.setattr(gates, "check_reset", check_and_look)
    rec = attempt(slot, "writer-heading", Oracle())
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.DIRTY_RESET), rec.detail
    assert slot.sandbox is None  # an invalid attempt's sandbox is never handed on
    assert details["locks"] == {lock_name("start.odt"): "foreign (someone@other-host)"}
    assert details["title"] != "start.odt - LibreOffice Writer"  # LibreOffice asks; nothing was typed
    assert attempt(slot, "writer-heading", Oracle(), seq=1).outcome is Outcome.SUCCESS


def test_reset_removes_locks_an_earlier_attempt_left(slot):
    first = attempt(slot, "writer-fix-typo", Oracle())
    assert first.outcome is Outcome.SUCCESS, first.detail
    env = slot.env
    assert isinstance(env, DesktopEnv) and env.inst is not None
    work = env.inst.work
    env.inst.stop()  # killed like a crash: the document lock and the profile lock stay behind
    assert (work / lock_name("start.odt")).exists()
    (work / lock_name("start.odt")).write_text(",someone,crashed-host,01.01.2024 00:00,file:///elsewhere;")
    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    env.reset(task)  # the environment's own reset, without the substrate emptying the folders first
    assert env.fingerprint() == task.start_fingerprint, env.fingerprint_details()
    assert env.fingerprint_details()["locks"] == {lock_name("start.odt"): "own"}


def test_stray_file_is_a_dirty_reset(slot):
    rec = attempt(slot, "writer-fix-typo", Oracle(), fault=InvalidCause.DIRTY_RESET)
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.DIRTY_RESET), rec.detail


def test_a_dialog_that_swallows_input_is_the_policys_hang(slot):
    # Find & Replace takes the focus; waiting for the document window to come back never ends. The
    # sandbox is alive and answers: the policy's own action hung -> failed, never invalid.
    plan = [ActionSpec("key", {"keys": "ctrl+h"}), ActionSpec("type", {"text": "lost words"}),
            ActionSpec("wait", {"title": r"^start\.odt - LibreOffice Writer$"})]
    rec = attempt(slot, "writer-fix-typo", replay.Replay(plan),
                  cfg=RolloutConfig(step_timeout_s=3, episode_timeout_s=60))
    assert (rec.outcome, rec.cause) == (Outcome.FAILED, None), rec.detail
    assert "live sandbox" in rec.detail


def test_verifier_unavailable_when_libreoffice_is_gone(slot):
    task = next(t for t in load_suite("desktop") if t.id == "calc-bold-header")
    env = slot.env
    assert isinstance(env, DesktopEnv)
    slot.provision()
    env.reset(task)
    assert env.inst is not None
    soffice = [int(p.split()[0]) for p in desktop_processes(str(env.inst.home)) if p.endswith("soffice.bin")]
    assert soffice
    assert DesktopEnv.instance_failed(env.instance, wait_s=0.2) is None  # running: no evidence
    for pid in soffice:
        os.kill(pid, signal.SIGKILL)
    # what a verifier whose UNO call broke mid-check looks for: LibreOffice's non-zero exit status
    # (its root exit wrapper's: soffice.bin killed -> oosplash exits 137, no restart)
    died = DesktopEnv.instance_failed(env.instance, wait_s=2.0)
    assert died is not None and "status 137" in died, died
    assert not env.instance.app_running()
    env.stage_verifier(task)
    with pytest.raises(InvalidAttempt) as e:
        env.run_verifier(task, 20)
    assert e.value.cause is InvalidCause.VERIFIER_UNAVAILABLE
    rec = attempt(slot, "calc-bold-header", Oracle(), fault=InvalidCause.VERIFIER_UNAVAILABLE)
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.VERIFIER_UNAVAILABLE), rec.detail



def _kill_soffice_after(env: DesktopEnv, delay_s: float) -> threading.Thread:
    """SIGKILL the instance's soffice.bin from outside ``delay_s`` after the episode's first step
    began (as the chaos run's ``desktop_kill`` does); the thread returns once it struck."""
    def strike() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and (env.inst is None or env.step_count == 0):
            time.sleep(0.02)
        time.sleep(delay_s)
        inst = env.inst
        assert inst is not None
        for p in desktop_processes(str(inst.home)):
            if p.endswith("soffice.bin"):
                os.kill(int(p.split()[0]), signal.SIGKILL)

    t = threading.Thread(target=strike, daemon=True)
    t.start()
    return t


def test_libreoffice_killed_under_a_step_that_awaits_a_title_is_invalid_not_the_policys_hang(slot):
    """A chaos run's ``desktop_kill`` under an oracle's ``wait`` for a dialog's title: the title never
    comes, and that is no hang of the policy's (before: a step timeout in a live sandbox, failed).
    The evidence is LibreOffice's exit status 137 from its root exit wrapper."""
    plan = [ActionSpec("key", {"keys": "ctrl+h"}), ActionSpec("wait", {"title": "^a window that never comes$"})]
    striker = _kill_soffice_after(slot.env, 1.0)  # the kill lands during the wait
    t0 = time.monotonic()
    rec = attempt(slot, "writer-fix-typo", replay.Replay(plan),
                  cfg=RolloutConfig(step_timeout_s=8, episode_timeout_s=60))
    striker.join(10)
    assert rec.outcome is Outcome.INVALID and rec.cause is InvalidCause.BAD_OBSERVATION, (rec.outcome, rec.detail)
    assert "status 137" in rec.detail, rec.detail
    assert time.monotonic() - t0 < 30  # seen at once, not after the step timeout
    assert slot.sandbox is None  # an invalid attempt's sandbox is never handed on


def test_a_status_file_the_policy_wrote_is_no_evidence_of_a_kill(slot):
    """The exit status lies in the sandbox's tmp, which the policy's shell (its own uid) may write: a
    137 it writes there is no evidence of a kill (a file of its uid). Positive control: LibreOffice
    killed from outside afterwards; its exit wrapper replaces the file with its own."""
    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    env = slot.env
    assert isinstance(env, DesktopEnv)
    slot.provision()
    env.reset(task)
    forge = 'f="$TMPDIR/.drumsbench-app-exit"; rm -f "$f"; echo 137 > "$f"; stat -c %u "$f"'
    obs = env.step(Action.of(ActionSpec("shell", {"command": forge}), env.generation), 30)
    inst = env.instance
    assert obs.content["result"]["stdout"].strip() == str(inst.policy_uid), obs.content["result"]
    assert inst.app_exit() is None and env.instance_failed(inst) is None and env.failure_evidence() is None
    for p in desktop_processes(str(inst.home)):
        if p.endswith("soffice.bin"):
            os.kill(int(p.split()[0]), signal.SIGKILL)
    died = env.instance_failed(inst, wait_s=5.0)
    assert died is not None and "status 137" in died, died
    # what the rollout asks on a step or episode timeout (``_timed_out``) names the kill too
    assert "status 137" in (env.failure_evidence() or ""), env.failure_evidence()
    # the wrapper's (openbox starts it as the applications' uid), never the policy's commands' uid
    assert inst.app_ids is not None
    assert os.stat(inst.app_exit_file).st_uid == inst.app_ids[0] != inst.policy_uid


# -- nothing left behind -------------------------------------------------------------------------------
def drumsbench(*args: str, state: Path) -> subprocess.Popen:
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    return subprocess.Popen([sys.executable, "-m", "drumsbench", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_no_desktop_processes_after_a_run(desktop_ready, tmp_path):
    """Nothing of a desktop run stays: no process, and nothing in the host's /tmp (LibreOffice's IPC
    sockets, X sockets and locks live in the sandbox's own tmp, seen as /tmp in its namespace)."""
    state, out = tmp_path / "state", tmp_path / "out"
    host_tmp = {p.name for p in Path("/tmp").iterdir()}
    proc = drumsbench("run", "--tasks", "desktop", "--attempts", "3", "--concurrency", "2", "--duration", "5m",
                      "--no-progress", "--out", str(out), state=state)
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    assert desktop_processes(str(state)) == []
    new = sorted({p.name for p in Path("/tmp").iterdir()} - host_tmp)
    assert not [n for n in new if n.startswith(("OSL_PIPE", ".X", "lu"))], new
    shots = sorted(p.relative_to(out).as_posix() for p in out.glob("screenshots/*/*/*.png"))
    assert len(shots) == 9 and all(s.endswith(("start.png", "middle.png", "end.png")) for s in shots), shots


@pytest.mark.parametrize("how", ["interrupt", "kill9"])
def test_no_desktop_processes_after_an_interrupted_or_killed_run(desktop_ready, tmp_path, how):
    state, out = tmp_path / "state", tmp_path / "out"
    proc = drumsbench("run", "--tasks", "desktop", "--duration", "5m", "--concurrency", "2", "--no-progress",
                      "--out", str(out), state=state)
    try:
        def started() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the run ended early: {proc.communicate()[0]}")
            return any(p.endswith(("soffice.bin", "Xvfb")) for p in desktop_processes(str(state)))

        wait_for(started, 120, "a desktop instance of the run")
        time.sleep(1.0)
        if how == "interrupt":
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            proc.communicate(timeout=120)
            assert desktop_processes(str(state)) == []
        else:
            proc.kill()
            proc.communicate(timeout=60)
            assert any(p.endswith("Xvfb") for p in desktop_processes(str(state))), "kill -9 left nothing to collect?"
            gc = drumsbench("gc", state=state)
            text, _ = gc.communicate(timeout=120)
            assert gc.returncode == 0, text
            wait_for(lambda: desktop_processes(str(state)) == [], 10, "gc to end every desktop process")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
