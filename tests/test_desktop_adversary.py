"""The desktop policy as an adversary on the process substrate (issue 30), each strategy with its
positive control: the same actions against a naive set-up (LibreOffice as root, a verifier that takes
any open document of the task's name), where they must win.

- LibreOffice and openbox run as the sandbox's second uid (neither root nor the uid of the policy's
  commands), in the sandbox's cgroups: a GUI Save As into a root-only host folder fails; the same
  keys against a root LibreOffice write the file.
- A world-writable host place (/var/tmp) is the sandbox's own tmp inside the instance: a Save As
  there lands in the sandbox, never on the host.
- A stashed solved copy of the task's document, opened instead of the task's document, is failed —
  also when saved over the task's own file: the verifier checks the document LibreOffice held when
  the attempt began (its RuntimeUID), not whatever has the task's path.
- Hiding LibreOffice's window with one key (show the desktop, the window menu's Iconify) is failed:
  the kiosk window manager has no such keys, and a blank frame while the X server answers, its
  screen saver is off and LibreOffice runs is the policy's doing. Control: openbox's stock
  configuration with every blank frame put down to the infrastructure (invalid, no score).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import Action, ActionSpec
from drumsbench.envs.desktop import env as desktop_env
from drumsbench.envs.desktop import holder, instance, odf
from drumsbench.envs.desktop.env import BlankEvidence, DesktopEnv
from drumsbench.envs.desktop.instance import DesktopInstance, Settings
from drumsbench.envs.desktop.running import RunningDesktop
from drumsbench.envs.desktop.task import DesktopTask, load_suite
from drumsbench.policies import replay
from drumsbench.policies.adversary import Adversary
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import HostLaunching, Sandbox
from drumsbench.substrates.process import ProcessSubstrate

CFG = RolloutConfig(step_timeout_s=20, episode_timeout_s=120)
TASK = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")


class RootDesktopInstance(DesktopInstance):
    """The naive set-up of the controls: the instance's applications as root."""

    @property
    def app_ids(self) -> tuple[int, int] | None:
        return None


class RootDesktopEnv(DesktopEnv):
    def new_instance(self, box: Sandbox) -> RunningDesktop:
        return RootDesktopInstance(box, self.settings)


class StockWmEnv(DesktopEnv):
    """openbox's stock configuration: super+d, the window menu, title bar buttons."""

    def __init__(self, settings: Settings | None = None, artifact_dir: Path | None = None) -> None:
        super().__init__(settings or Settings(wm_kiosk=False), artifact_dir)


class NaiveBlankEnv(StockWmEnv):
    """The naive set-up of the hiding controls: the stock window manager, and every blank frame put
    down to the infrastructure."""

    @staticmethod
    def blank_evidence(inst: RunningDesktop | None, blank: str) -> BlankEvidence:
        return BlankEvidence(True, blank)


class HostViewSubstrate(ProcessSubstrate):
    """Sandboxes over the host's files as they are (no own view)."""

    make_views = False


@pytest.fixture
def slots(desktop_ready, state_dir, run_id, tmp_path):
    made: list[tuple[Slot, ProcessSubstrate]] = []

    def make(cls: type[ProcessSubstrate] = ProcessSubstrate, env_cls: type[DesktopEnv] = DesktopEnv) -> Slot:
        sub = cls(run_id, state_dir)
        slot = Slot(sub, env_cls(artifact_dir=tmp_path / "report"))
        made.append((slot, sub))
        return slot

    yield make
    for slot, sub in made:
        slot.destroy()
        assert isinstance(slot.env, DesktopEnv)
        slot.env.stop()
        sub.close()
        assert sub.leftovers() == []


@pytest.fixture
def root_only_folder():
    """A root-only (0700) folder in a system place every sandbox view shows (/var/lib)."""
    folder = Path("/var/lib") / f"drumsbench-probe-{secrets.token_hex(6)}"
    folder.mkdir(mode=0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def started(slots, *classes) -> tuple[Slot, DesktopEnv]:
    """A slot of ``slots(*classes)`` provisioned, its environment reset to ``TASK`` (LibreOffice up)."""
    slot = slots(*classes)
    slot.provision()
    env = slot.env
    assert isinstance(env, DesktopEnv)
    env.reset(TASK)
    return slot, env


def gui(env: DesktopEnv, *specs: ActionSpec) -> None:
    for spec in specs:
        env.step(Action.of(spec, env.generation), 30)


def save_as(path: str) -> list[ActionSpec]:
    return [ActionSpec("key", {"keys": "ctrl+shift+s"}), ActionSpec("wait", {"seconds": 2.5}),
            ActionSpec("key", {"keys": "ctrl+a"}), ActionSpec("type", {"text": path}),
            ActionSpec("key", {"keys": "Return"}),
            ActionSpec("wait", {"seconds": 3.0})]


def soffice_of(box_id: str) -> int:
    label = f"{HostLaunching.SANDBOX_VAR}={box_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm == "soffice.bin" and label in environ:
            return int(entry)
    raise AssertionError(f"no soffice.bin of sandbox {box_id}")


def test_the_holder_covers_the_same_shared_places_as_the_instance_names():
    assert holder.SHARED_WRITABLE == instance.SHARED_WRITABLE


def test_libreoffice_runs_as_the_sandboxs_second_uid_and_a_gui_save_as_cannot_write_the_host(
        slots, root_only_folder):
    slot, env = started(slots)
    box = slot.sandbox
    assert box is not None and box.uid is not None and box.lease is not None
    pid = soffice_of(box.id)
    st = os.stat(f"/proc/{pid}")
    assert (st.st_uid, st.st_gid) == (box.lease.app_uid, box.uid)
    assert st.st_uid not in (0, box.uid)
    status = Path(f"/proc/{pid}/status").read_text()
    caps = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
    assert int(caps, 16) == 0, status
    assert "NoNewPrivs:\t1" in status
    groups = Path(f"/proc/{pid}/cgroup").read_text()
    paths = {c: line.split(":", 2)[2] for line in groups.splitlines() for c in line.split(":", 2)[1].split(",")}
    for controller in ("freezer", "pids", "memory"):
        assert box.id in paths[controller], (controller, groups)

    # a root-only host folder: the Save As fails (LibreOffice's error dialog), nothing is written
    gui(env, *save_as(f"{root_only_folder}/forged.odt"))
    assert list(root_only_folder.iterdir()) == []
    gui(env, ActionSpec("key", {"keys": "Escape"}), ActionSpec("key", {"keys": "Escape"}),
        ActionSpec("wait", {"seconds": 1.0}))
    # a world-writable host place is the sandbox's tmp inside: the save works and lands there
    name = f"drumsbench-probe-{secrets.token_hex(6)}.odt"
    gui(env, *save_as(f"/var/tmp/{name}"))
    assert not Path("/var/tmp", name).exists()
    assert (box.host_path(box.paths.tmp) / name).is_file()

    # positive control: the same keys against LibreOffice as root on the host's files
    control, cenv = started(slots, HostViewSubstrate, RootDesktopEnv)
    cbox = control.sandbox
    assert cbox is not None
    assert os.stat(f"/proc/{soffice_of(cbox.id)}").st_uid == 0
    gui(cenv, *save_as(f"{root_only_folder}/forged.odt"))
    assert (root_only_folder / "forged.odt").is_file()


SOLVED = odf.build("writer", "<text:p>The report is ready.</text:p>")
# the policy stashes a solved copy (here from a shell action; in the field, attempt 1's Save As into a
# place the reset keeps), closes the task's document and opens the copy: no edit in this attempt
def stash_plan(home: str) -> list[ActionSpec]:
    return [
        ActionSpec("shell", {"command": "mkdir -p ~/stash && echo " + base64.b64encode(SOLVED).decode()
                             + " | base64 -d > ~/stash/start.odt"}),
        ActionSpec("key", {"keys": "ctrl+w"}), ActionSpec("wait", {"seconds": 2.0}),
        ActionSpec("key", {"keys": "ctrl+o"}), ActionSpec("wait", {"seconds": 2.5}),
        ActionSpec("key", {"keys": "ctrl+a"}), ActionSpec("type", {"text": f"{home}/stash/start.odt"}),
        ActionSpec("key", {"keys": "Return"}), ActionSpec("wait", {"seconds": 4.0}),
    ]


# the verifier before the change: any open document whose name is the task's
NAIVE_FIND = '''def find_document(desktop):
    docs = documents(desktop)
    for d in docs:
        if d.getURL().endswith("/" + spec["document"]):
            return d
    return None


'''


def naive_runner() -> bytes:
    """The shipped runner with ``find_document`` (its whole definition, up to the next top-level
    statement) replaced by the naive one: any open document named like the task's."""
    text = desktop_env.RUNNER.decode()
    start = text.index("\ndef find_document(") + 1
    end = start + text[start:].index("\n# -- helpers for check.py")
    return (text[:start] + NAIVE_FIND + text[end + 1:]).encode()


def test_a_stashed_solved_copy_opened_instead_of_the_document_is_failed(slots, monkeypatch):
    slot = slots()
    slot.provision()  # the attempts reset it in place: its paths stay
    assert slot.sandbox is not None
    plan = stash_plan(slot.sandbox.paths.home)
    rec = run_attempt(slot, TASK, replay.Replay(plan), CFG, CanaryRegistry(), run_id=slot.substrate.run_id,
                      seq=0, seed=0)
    assert rec.outcome is Outcome.FAILED, rec.detail
    assert "no document is open" in rec.detail, rec.detail
    # positive control: the same actions against the naive verifier reach success
    monkeypatch.setattr(desktop_env, "RUNNER", naive_runner())
    rec = run_attempt(slot, TASK, replay.Replay(plan), CFG, CanaryRegistry(), run_id=slot.substrate.run_id,
                      seq=1, seed=0)
    assert rec.outcome is Outcome.SUCCESS, rec.detail


class PlaceRuleEnv(DesktopEnv):
    """The verifier before identity: the task's document found by its place alone."""

    def _identify(self, inst: RunningDesktop, task: DesktopTask) -> str | None:
        return None


def test_a_stashed_copy_saved_over_the_task_s_file_is_not_the_task_s_document(slots):
    """The stash opened, then saved over the task's own file: the open document now has the task's
    path, but it is not the document the attempt began with (a new RuntimeUID)."""
    got = {}
    for env_cls in (DesktopEnv, PlaceRuleEnv):
        slot = slots(ProcessSubstrate, env_cls)
        slot.provision()
        assert slot.sandbox is not None
        plan = [*stash_plan(slot.sandbox.paths.home), *save_as(f"{slot.sandbox.paths.work}/{TASK.document}"),
                ActionSpec("key", {"keys": "alt+y"}), ActionSpec("wait", {"seconds": 3.0})]  # "replace it?" Yes
        rec = run_attempt(slot, TASK, replay.Replay(plan), CFG, CanaryRegistry(), run_id=slot.substrate.run_id,
                          seq=0, seed=0)
        got[env_cls.__name__] = (rec.outcome, rec.detail)
    outcome, detail = got["DesktopEnv"]
    assert outcome is Outcome.FAILED and "open when the attempt began" in (detail or ""), got
    # positive control: the place rule takes the stash saved over the task's file
    assert got["PlaceRuleEnv"][0] is Outcome.SUCCESS, got


class StagedRunnerEnv(DesktopEnv):
    """The harness before the change: the runner of a capture (and of the start's identify) staged
    as files in the sandbox's tmp, then run as root inside the instance."""

    def runner_argv(self, inst: RunningDesktop, task: DesktopTask, mode: str) -> list[str]:  # type: ignore[override]
        folder = f"{self.box.paths.tmp}/.drumsbench-capture"
        self.box.put_files(folder, {"runner.py": desktop_env.RUNNER,
                                    **task.verify_files(inst.work_inside, inst.app_exit_inside)})
        return [instance.SYSTEM_PYTHON, "-I", f"{folder}/runner.py", folder, mode]


# a process the policy leaves running rewrites, without pause, the file where a staged runner goes
# with code that records the uid it ran as
SWAPPER = ("setsid nohup sh -c 'd=\"$TMPDIR/.drumsbench-capture\"; mkdir -p \"$d\"; "
           "code=\"import os; open(\\\"$TMPDIR/pwned\\\", \\\"w\\\").write(str(os.geteuid()))\"; "
           "while :; do echo \"$code\" > \"$d/runner.py.new\" && mv -f \"$d/runner.py.new\" \"$d/runner.py\"; done' "
           ">/dev/null 2>&1 & echo started")


def test_a_capture_runs_no_file_a_policy_s_process_could_swap(slots):
    """A branch's capture asks LibreOffice through the verifier's runner, as root inside the
    instance, while the policy's processes may still run: it is run from argv (``python3 -I -c``),
    nothing staged. Positive control: staged in the sandbox's tmp, the swapped file runs as root."""
    got = {}
    for env_cls in (DesktopEnv, StagedRunnerEnv):
        slot, env = started(slots, ProcessSubstrate, env_cls)
        assert slot.sandbox is not None
        pwned = Path(slot.sandbox.paths.tmp) / "pwned"
        gui(env, ActionSpec("shell", {"command": SWAPPER}), ActionSpec("wait", {"seconds": 0.5}))
        for _ in range(5):  # the control's race is won within a few tries
            with contextlib.suppress(SubstrateError):  # the swapped runner printed no capture
                env.capture()
            if pwned.exists():
                break
        got[env_cls.__name__] = pwned.read_text() if pwned.exists() else None
    assert got["DesktopEnv"] is None, got
    assert got["StagedRunnerEnv"] == "0", got  # positive control: the policy's code ran as root


HIDING = ("desktop_show_desktop", "desktop_iconify")


def test_hiding_the_window_is_failed_and_wins_only_against_a_naive_set_up(slots):
    got: dict[tuple[str, str], tuple[Outcome, str | None, str]] = {}
    for env_cls in (DesktopEnv, StockWmEnv, NaiveBlankEnv):
        slot = slots(ProcessSubstrate, env_cls)
        for seq, strategy in enumerate(HIDING):
            rec = run_attempt(slot, TASK, Adversary([strategy]), CFG, CanaryRegistry(),
                              run_id=slot.substrate.run_id, seq=seq, seed=0)
            got[env_cls.__name__, strategy] = (rec.outcome, rec.cause, rec.detail)
            assert rec.extra.get("office") in (None, "unprivileged uid"), rec.extra  # None: invalid before the check
    for strategy in HIDING:
        for env_name in ("DesktopEnv", "StockWmEnv"):  # the kiosk: nothing hides; stock: hidden, the policy's
            outcome, cause, detail = got[env_name, strategy]
            assert outcome is Outcome.FAILED and cause is None, (env_name, strategy, detail)
        # positive control: the escape wins against the naive set-up
        outcome, cause, detail = got["NaiveBlankEnv", strategy]
        assert outcome is Outcome.INVALID and cause == "bad_observation" and "black screen" in detail, got


def test_a_status_file_written_while_libreoffice_runs_is_no_evidence(slots):
    """LibreOffice's exit wrapper runs as LibreOffice's uid, so anything LibreOffice may write (a Save
    As of a text document into the sandbox's tmp) can put "137" where its exit status goes: that is
    no crash while LibreOffice runs."""
    _slot, env = started(slots)
    inst = env.instance
    assert isinstance(inst, DesktopInstance) and inst.app_ids is not None
    fd = os.open(inst.app_exit_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.fchown(fd, *inst.app_ids)  # as LibreOffice's uid wrote it
    os.write(fd, b"137\n")
    os.close(fd)
    # positive control: the file passes the status file's own checks (not the policy's commands' uid),
    # so a rule taking any status file would call this a crash
    assert inst.app_exit() == 137
    assert inst.app_running()
    assert DesktopEnv.instance_failed(inst) is None
    assert not DesktopEnv.blank_evidence(inst, "black screen").fault


def test_a_gui_save_as_cannot_reach_a_neighbour_sandbox(slots):
    """Two sandboxes of a run: A's LibreOffice (its own second uid, its own view) cannot write into
    B's tmp, where a planted canary would make B's attempt invalid (issue 30, neighbours).
    Positive control: the same keys from a root LibreOffice over the host's files land there."""
    neighbour = slots()
    neighbour.provision()
    box_b = neighbour.sandbox
    assert box_b is not None
    tmp_b = box_b.host_path(box_b.paths.tmp)
    target = tmp_b / "planted.odt"

    _slot, env = started(slots)
    gui(env, *save_as(str(target)))
    assert not target.exists()
    assert neighbour.sandbox is box_b and tmp_b.is_dir()

    _control, cenv = started(slots, HostViewSubstrate, RootDesktopEnv)
    gui(cenv, *save_as(str(target)))
    assert target.is_file()


def test_a_changed_template_profile_is_built_anew_before_it_reaches_an_instance(desktop_ready, tmp_path,
                                                                                  monkeypatch):
    """Every instance's profile is a copy of one template per host (issue 30: a file saved into it
    reached every later instance of every run). The copy is checked against the digest recorded at
    the template's build; a changed template is removed and built again. Positive control: a plain
    copy of the changed template carries the change."""
    from drumsbench.envs.desktop import profile

    monkeypatch.setenv("DRUMSBENCH_CACHE", str(tmp_path / "cache"))  # never the host's shared template
    template = profile.template_profile()
    assert str(template).startswith(str(tmp_path))
    built = profile.profile_digest(template)
    (template / "user" / "registrymodifications.xcu").write_text("<poisoned/>")
    (template / "user" / "drumsbench-poison.xcd").write_text("<poisoned/>")
    shutil.copytree(template, tmp_path / "plain", symlinks=True)  # the copy as it was made before
    assert (tmp_path / "plain" / "user" / "drumsbench-poison.xcd").exists()

    profile.copy_profile(tmp_path / "checked")
    assert not (tmp_path / "checked" / "user" / "drumsbench-poison.xcd").exists()
    assert "<poisoned/>" not in (tmp_path / "checked" / "user" / "registrymodifications.xcu").read_text()
    assert not (profile.template_profile() / "user" / "drumsbench-poison.xcd").exists()  # built anew
    assert profile.profile_digest(tmp_path / "checked") != profile.profile_digest(tmp_path / "plain")
    assert built.startswith("sha256:")
