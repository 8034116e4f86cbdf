"""The desktop environment on the ``bwrap``, ``overlay``, ``docker`` and ``podman`` substrates
(docs/desktop.md, "Where it runs").

Through the real environment and rollout: the oracle succeeds and the null policy fails on a Writer
and a Calc task; the gates hold (a black screen and a frozen one are ``bad_observation``, a planted
stale lock is ``dirty_reset``); a policy's shell action is not offered there (it would keep the
view's CAP_DAC_OVERRIDE and reach the instance's sockets) and asking for one is the policy's failure,
never an invalid attempt; and nothing is left afterwards (processes, mounts, sockets in the host's /tmp,
sandbox folders, containers). In a container the instance has the container's bounds: its cgroups,
its capability bounding set, no_new_privs. The vm (a guest instance) is tested in test_desktop_vm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_desktop import desktop_processes

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.instance import Settings
from drumsbench.envs.desktop.task import load_suite
from drumsbench.policies.scripted import Null, Oracle, Policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.base import ImageFlavors, Substrate
from drumsbench.substrates.containers.common import ContainerSandbox

from conftest import require

CFG = RolloutConfig(step_timeout_s=20, episode_timeout_s=120)


def host_tmp_sockets() -> set[str]:
    """X and LibreOffice sockets in the host's /tmp (an instance must make none there)."""
    found = {str(p) for p in Path("/tmp").glob("OSL_PIPE_*")}
    x11 = Path("/tmp/.X11-unix")
    if x11.is_dir():
        found |= {str(p) for p in x11.iterdir()}
    return found


def _slot(name: str, state_dir: Path, run_id: str, tmp_path: Path):
    cls = registry.get(name)
    require(cls.missing())
    before = host_tmp_sockets()
    sub: Substrate = cls(run_id, state_dir)
    if isinstance(sub, ImageFlavors):
        sub.use_flavor(DesktopEnv.image_flavor)
    # a start may take long on a loaded host: these tests judge outcomes, not start times
    s = Slot(sub, DesktopEnv(Settings(start_timeout_s=90), artifact_dir=tmp_path / "report"))
    yield s
    s.destroy()
    s.env.stop()  # type: ignore[attr-defined]
    sub.close()
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state_dir) in line]
    folders = [str(p) for p in (state_dir / name).glob("*/*")]
    sockets = sorted(host_tmp_sockets() - before)
    # processes (by the state folder, or the run's label: a container's), the substrate's own account
    # (containers), mounts, sandbox folders, sockets in the host's /tmp
    procs = sorted(set(desktop_processes(str(state_dir)) + desktop_processes(f"DRUMSBENCH_RUN={run_id}")))
    assert procs + sub.leftovers() + mounts + folders + sockets == []


@pytest.fixture(params=["bwrap", "overlay", "docker", "podman"])
def slot(request, desktop_ready, state_dir, run_id, tmp_path):
    yield from _slot(request.param, state_dir, run_id, tmp_path)


@pytest.fixture(params=["docker", "podman"])
def container_slot(request, desktop_ready, state_dir, run_id, tmp_path):
    yield from _slot(request.param, state_dir, run_id, tmp_path)


def attempt(slot: Slot, task_id: str, policy: Policy, *, seq: int = 0, fault: InvalidCause | None = None):
    task = next(t for t in load_suite("desktop") if t.id == task_id)
    return run_attempt(slot, task, policy, CFG, CanaryRegistry(), run_id=slot.substrate.run_id, seq=seq,
                       seed=0, fault=fault)


@pytest.mark.parametrize("task_id", ["writer-fix-typo", "calc-bold-header"])
def test_oracle_succeeds_and_null_fails(slot, task_id):
    oracle = attempt(slot, task_id, Oracle(), seq=0)
    assert oracle.outcome is Outcome.SUCCESS, oracle.detail
    null = attempt(slot, task_id, Null(), seq=1)
    assert null.outcome is Outcome.FAILED, null.detail
    shots = slot.env.artifact_dir / "screenshots" / slot.substrate.run_id / task_id
    assert {p.name for p in shots.glob("*.png")} == {"start.png", "middle.png", "end.png"}


def assert_gates(slot: Slot, seq: int = 0) -> None:
    """A black screen and a frozen one (the X server stopped) are bad_observation, a planted stale
    lock is dirty_reset (attempts ``seq`` .. ``seq + 2``)."""
    env = slot.env
    assert isinstance(env, DesktopEnv)
    black = attempt(slot, "writer-fix-typo", Oracle(), seq=seq, fault=InvalidCause.BAD_OBSERVATION)
    assert (black.outcome, black.cause) == (Outcome.INVALID, InvalidCause.BAD_OBSERVATION), black.detail
    assert "black screen" in black.detail
    env.observation_fault = "frozen"  # SIGSTOP the instance's X server
    frozen = attempt(slot, "writer-fix-typo", Oracle(), seq=seq + 1, fault=InvalidCause.BAD_OBSERVATION)
    assert (frozen.outcome, frozen.cause) == (Outcome.INVALID, InvalidCause.BAD_OBSERVATION), frozen.detail
    assert "frozen" in frozen.detail
    env.plant_stale_lock = True
    stale = attempt(slot, "writer-fix-typo", Oracle(), seq=seq + 2)
    assert (stale.outcome, stale.cause) == (Outcome.INVALID, InvalidCause.DIRTY_RESET), stale.detail


def test_black_and_frozen_screens_and_a_stale_lock_are_invalid(slot):
    assert_gates(slot)


def test_a_shell_action_is_not_offered_and_asking_for_one_is_the_policys_doing(slot):
    """No uid of its own on these substrates: a shell action would keep CAP_DAC_OVERRIDE as the view's
    root and reach the instance's X and LibreOffice sockets (through the sandbox's other paths too),
    so it is not offered. Asking for one gives the policy an error, never an invalid attempt."""
    from drumsbench.envs.base import ActionSpec
    from drumsbench.policies import replay

    env = slot.env
    assert isinstance(env, DesktopEnv)
    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    asks = replay.Replay([ActionSpec("shell", {"command": "pkill -9 Xvfb; touch /sandbox/work/mine"}),
                          ActionSpec("wait", {"seconds": 0.5})])
    rec = attempt(slot, task.id, asks)
    assert rec.outcome is Outcome.FAILED and rec.cause is None, (rec.outcome, rec.cause, rec.detail)
    box = slot.substrate.create()
    try:
        env.attach(box)
        env.reset(task)
        inst = env.instance
        assert "shell actions are not offered" in str(inst.shell_unavailable())
        with pytest.raises(Exception, match="shell actions are not offered"):  # never reached by a policy
            inst.exec_inside(["/bin/sh", "-c", "true"], timeout=20, all_namespaces=True, as_sandbox_user=True)
        assert not (inst.work / "mine").exists() and inst.alive() and inst.app_running()
    finally:
        env.stop()
        box.destroy()


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _groups(pid: int) -> set[str]:
    return set(Path(f"/proc/{pid}/cgroup").read_text().splitlines())


def test_a_container_desktop_has_the_containers_bounds(container_slot):
    """In a container, every process of the instance is in the container's cgroups (its pids and
    memory limits count it, a pause freezes it), has the container's capability bounding set (not
    the host root's of the launcher that entered it) and no_new_privs. The control: the launcher's
    own process (``sh`` then ``nsenter`` on the host) has the host root's full set, so the
    comparison can fail."""
    slot = container_slot
    env = slot.env
    assert isinstance(env, DesktopEnv)
    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    box = slot.substrate.create()
    try:
        assert isinstance(box, ContainerSandbox)
        env.attach(box)
        env.reset(task)
        inst = env.instance
        assert inst.app_running()
        init = box.init_pid()
        want = _status(init)
        pids = list(inst.namespace_pids().values())
        names = {Path(f"/proc/{p}/comm").read_text().strip() for p in pids}
        assert {"Xvfb", "openbox", "soffice.bin"} <= names, names
        for pid in pids:
            st = _status(pid)
            assert (st["CapBnd"], st["NoNewPrivs"]) == (want["CapBnd"], "1"), (pid, st["Name"], st["CapBnd"])
            assert _groups(pid) == _groups(init), st["Name"]
        assert inst.proc is not None
        launcher = _status(inst.proc.pid)  # control: the host-side launcher keeps the host root's set
        assert int(launcher["CapBnd"], 16) & ~int(want["CapBnd"], 16), launcher["CapBnd"]
    finally:
        env.stop()
        box.destroy()


def test_a_save_as_into_the_containers_system_fails_and_no_reset_keeps_a_change_there(container_slot, monkeypatch):
    """Two fences, each enough alone: LibreOffice runs as an unprivileged uid, and the instance sees
    the container's layer read-only but for the sandbox's folder and /tmp — so a GUI Save As into
    /etc fails with both, and with either one taken away; and a reset in place finds the layer
    outside the sandbox's folders as it was handed over, else refuses (the rollout then makes a
    fresh sandbox). Positive control: LibreOffice as the container's root with the layer writable —
    the same keys write /etc, and the reset's script alone keeps the file for every later attempt."""
    import dataclasses

    from test_desktop_adversary import gui, save_as

    from drumsbench.core.errors import SubstrateError

    slot = container_slot
    env = slot.env
    assert isinstance(env, DesktopEnv)
    task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
    poison = "/etc/drumsbench-poison.odt"  # the filter's own extension: LibreOffice adds none
    box = slot.substrate.create()
    try:
        assert isinstance(box, ContainerSandbox)
        env.attach(box)
        real = box.launch_view
        both_off = {"app_ids": None, "read_only_system": False}
        for fences in ({}, {"app_ids": None}, {"read_only_system": False}, both_off):
            monkeypatch.setattr(box, "launch_view", lambda f=fences: dataclasses.replace(real(), **f))
            env.reset(task)
            gui(env, *save_as(poison))
            written = box.exec(["test", "-e", poison], timeout=30).exit_code == 0
            env.stop()
            if len(fences) < 2:  # at least one fence stands: nothing written, the reset passes
                assert not written, fences
                box.reset_in_place()
        assert written  # positive control: neither fence
        with pytest.raises(SubstrateError, match=f"\\+{poison}"):
            box.reset_in_place()
        assert box.exec(["test", "-e", poison], timeout=30).exit_code == 0  # the script alone kept it
    finally:
        env.stop()
        box.destroy()


def test_hiding_the_window_is_the_policys_failure_everywhere(slot):
    """The one-key escapes of issue 30 (show the desktop, the window menu's Iconify) end failed on
    every substrate: the kiosk window manager has no such keys, and a blank frame while the X server
    answers is put down to the policy (their positive controls: tests/test_desktop_adversary.py)."""
    from drumsbench.policies.adversary import Adversary

    for seq, strategy in enumerate(("desktop_show_desktop", "desktop_iconify")):
        rec = attempt(slot, "writer-fix-typo", Adversary([strategy]), seq=seq)
        assert rec.outcome is Outcome.FAILED and rec.cause is None, (strategy, rec.outcome, rec.cause, rec.detail)


@pytest.mark.parametrize("name", ["bwrap", "overlay", "docker", "podman"])
def test_libreoffice_is_not_root(name, desktop_ready, state_dir, run_id, tmp_path):
    """On overlay, docker and podman the instance's applications run as ``VIEW_APP_UID`` (no
    capability): the view's root would read every root-owned file the view shows, and a container's
    root (no user namespace) is the host's. Control: Xvfb, started by the same holder, is root — the
    comparison can fail."""
    from drumsbench.substrates.hostproc import VIEW_APP_UID

    for slot in _slot(name, state_dir, run_id, tmp_path):
        env = slot.env
        assert isinstance(env, DesktopEnv)
        task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
        slot.provision()
        env.reset(task)
        by_name = {Path(f"/proc/{p}/comm").read_text().strip(): p for p in env.instance.namespace_pids().values()}
        office = _status(by_name["soffice.bin"])
        assert office["Uid"].split()[0] == str(VIEW_APP_UID) and int(office["CapEff"], 16) == 0, office
        assert _status(by_name["Xvfb"])["Uid"].split()[0] == "0"
        assert env.instance.office_runs_as == "unprivileged uid"  # what the attempt's verify_note records
