"""The desktop policy as an adversary on the process substrate (issue 30), each strategy with its
positive control: the same actions against a naive set-up (LibreOffice as root, a verifier that takes
any open document of the task's name), where they must win.

- LibreOffice and openbox run as the sandbox's second uid (neither root nor the uid of the policy's
  commands), in the sandbox's cgroups: a GUI Save As into a root-only host folder fails; the same
  keys against a root LibreOffice write the file.
- A world-writable host place (/var/tmp) is the sandbox's own tmp inside the instance: a Save As
  there lands in the sandbox, never on the host.
- A stashed solved copy of the task's document, opened instead of the task's document, is failed.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
from pathlib import Path

import pytest

from drumsbench.core.outcome import Outcome
from drumsbench.envs.base import Action, ActionSpec
from drumsbench.envs.desktop import env as desktop_env
from drumsbench.envs.desktop import holder, instance, odf
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.instance import DesktopInstance
from drumsbench.envs.desktop.running import RunningDesktop
from drumsbench.envs.desktop.task import load_suite
from drumsbench.policies import replay
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
    slot = slots()
    slot.provision()
    env = slot.env
    assert isinstance(env, DesktopEnv)
    env.reset(TASK)
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
    control = slots(HostViewSubstrate, RootDesktopEnv)
    control.provision()
    cenv = control.env
    assert isinstance(cenv, DesktopEnv)
    cenv.reset(TASK)
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


def paragraphs(doc):'''


def naive_runner() -> bytes:
    text = desktop_env.RUNNER.decode()
    start = text.index("def find_document(desktop):")
    end = text.index("def paragraphs(doc):")
    return (text[:start] + NAIVE_FIND + text[end + len("def paragraphs(doc):"):]).encode()


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
