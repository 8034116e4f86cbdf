"""Issue 35: no answer key and no host service in a sandbox's reach.

The red-team strategy ``read_answer_key`` searches wherever a sandbox could read a task's golden
patch (the harness's checkout and package found through other processes' command lines, site
packages, git objects, suites in the host's shared places) and applies the first that fits. It
must find nothing and end failed on every substrate; its positive control is a ``process``
substrate without its own view (the host's files and network as they are), where it must find
the key and score **success** with nothing solved.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.answer_keys import harness_places
from drumsbench.core.outcome import Outcome
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.adversary import SHELL, Adversary
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.substrates.base import Helper
from drumsbench.substrates.conformance import ConformanceFailure, check_no_host_loopback
from drumsbench.substrates.process import ProcessSubstrate

from conftest import require
from helpers import one_task_suite

CFG = RolloutConfig(step_timeout_s=60.0, episode_timeout_s=120.0, verify_timeout_s=30.0, max_steps=5)
SEARCH = SHELL["read_answer_key"][0]


class BareProcess(ProcessSubstrate):
    """The control: process sandboxes that share the host's files and network (no own view)."""

    make_views = False


@pytest.fixture(scope="module")
def suite() -> Iterator[Path]:
    """A user's suite folder where every user can read it (``/var/tmp``, as a downloaded suite),
    with one built-in task: its golden patch is the answer key to find."""
    parent = Path(tempfile.mkdtemp(prefix="drumsbench-suite-", dir="/var/tmp"))
    try:
        parent.chmod(0o755)
        folder = one_task_suite(parent)
        for p in [folder, *folder.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        yield folder
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _attempt(sub, suite: Path, run_id: str) -> tuple[Outcome, str, str]:
    """(outcome, detail, what the search printed) of the strategy on the suite's task: once through
    the real rollout, once as a plain command in a sandbox holding the task's start files."""
    sub.hide(suite)  # as make_substrate does for a run's suite
    (task,) = load_suite(str(suite))
    slot = Slot(sub, CodingEnv())
    try:
        rec = run_attempt(slot, task, Adversary(["read_answer_key"]), CFG, CanaryRegistry(), run_id=run_id,
                          seq=0, seed=0)
    finally:
        slot.destroy()
    box = sub.create()
    try:
        box.put_files(box.paths.work, task.files)
        said = box.exec(SEARCH, timeout=60, cwd=box.paths.work).stdout.decode(errors="replace")
    finally:
        box.destroy()
    return rec.outcome, rec.detail, said


@pytest.mark.parametrize("substrate", ["process", "bwrap", "overlay", "docker", "podman"])
def test_the_answer_key_is_out_of_reach(substrate, suite, state_dir, run_id):
    require(registry.get(substrate).missing())
    sub = registry.get(substrate)(run_id, state_dir)
    try:
        outcome, detail, said = _attempt(sub, suite, run_id)
    finally:
        sub.close()
    assert "answer keys found: 0" in said, said
    assert outcome is Outcome.FAILED, detail


def test_positive_control_without_the_view_the_key_is_found(suite, state_dir, run_id):
    sub = BareProcess(run_id, state_dir)
    try:
        outcome, detail, said = _attempt(sub, suite, run_id)
    finally:
        sub.close()
    assert "applied an answer key" in said, said
    assert outcome is Outcome.SUCCESS, detail  # a forged success: nothing was solved


def test_a_run_hides_its_suite_and_the_harness(suite, run_id):
    from drumsbench.experiments.run import make_substrate

    sub = make_substrate("process", run_id, str(suite))
    try:
        assert suite.resolve() in sub.hidden
        assert set(harness_places()) <= set(sub.hidden)
    finally:
        sub.close()


def test_the_loopback_check_fails_a_sandbox_on_the_hosts_network(state_dir, run_id):
    """``check_no_host_loopback``'s own control: a process substrate without its view that declared
    no network is caught (the sandbox reached the listener)."""

    class Liar(BareProcess):
        def __init__(self, run_id: str, state_dir: Path) -> None:
            super().__init__(run_id, state_dir)
            self.capabilities = self.capabilities.model_copy(update={"network": False})

    sub = Liar(run_id, state_dir)
    try:
        with pytest.raises(ConformanceFailure, match="reached"):
            check_no_host_loopback(sub)
    finally:
        sub.close()


def test_a_process_sandbox_serves_on_its_own_loopback(state_dir, run_id):
    """Its own ``lo`` is up: a task's tests may listen and connect on 127.0.0.1 inside."""
    sub = ProcessSubstrate(run_id, state_dir)
    box = sub.create()
    try:
        code = ("import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                "c = socket.create_connection(s.getsockname(), 5); print('own loopback ok')")
        res = box.exec(f'python3 -c "{code}"', timeout=30)
        assert res.stdout.strip() == b"own loopback ok", res.stderr
    finally:
        box.destroy()
        sub.close()


def test_a_sandbox_under_a_covered_folder_keeps_its_own(run_id):
    """A state folder every user can reach below a covered top-level folder (``/opt`` here, as
    ``/work`` or ``/home`` would be): the sandbox's folder is bound back into the cover's
    skeleton; what lies beside it stays out of sight."""
    parent = Path(tempfile.mkdtemp(prefix="drumsbench-test-", dir="/opt"))
    try:
        parent.chmod(0o755)
        (parent / "beside.txt").write_text("not the sandbox's\n")
        (parent / "state").mkdir(mode=0o755)
        sub = ProcessSubstrate(run_id, parent / "state")
        box = sub.create()
        try:
            assert parent in box.host_root.parents  # not moved to the shared base: reachable here
            res = box.exec(f"echo mine > f && cat f && ls -A {parent} && cat {parent}/beside.txt", timeout=30)
            assert res.stdout.decode().splitlines() == ["mine", "state"], (res.stdout, res.stderr)
            assert b"No such file" in res.stderr
            assert (box.host_root / "work" / "f").read_text() == "mine\n"  # the host's folder, written
        finally:
            box.destroy()
            sub.close()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize("substrate_class", [ProcessSubstrate, BareProcess], ids=["own_view", "control"])
def test_no_launch_path_walks_around_the_covers(substrate_class, state_dir, run_id):
    """A relative walk up from the work folder (``../../..``) to the harness's checkout, from every
    way a process sandbox starts something: a command (its first, started directly, and later ones,
    by the spawner), a stream, a helper and the launch view (the desktop's instance). Each must be
    refused; on the control (no view) each lists the tasks, so the probe itself works. (nsenter's
    ``--wd`` left a command's cwd on the host's mount, and this walk reached the checkout around
    every cover.)"""
    target = harness_places()[0] / "tasks"
    sub = substrate_class(run_id, state_dir)
    box = sub.create()
    try:
        up = "../" * box.paths.work.count("/") + str(target).lstrip("/")
        probe = f"ls {up} 2>&1 | head -3"
        seen = {}
        for _ in range(12):  # the first directly; the spawner takes over once it is ready
            seen.setdefault("spawner" if box._spawner and box._spawner.usable() else "direct",
                            box.exec(probe, timeout=30, cwd=box.paths.work).stdout)
            time.sleep(0.05)
        stream = box.open_stream(["sh", "-c", probe], cwd=box.paths.work)
        seen["stream"] = _read_all(stream.stdout_fd)
        stream.close()
        end = Helper.HELPER_END.decode()
        helper = box.start_helper(["sh", "-c", f"while read _; do {probe}; echo {end} 0; done"], cwd=box.paths.work)
        seen["helper (root)"] = helper.call(b"go\n", timeout=30).stdout
        helper.stop()
        view = box.launch_view()  # the desktop's instance starts from here, as root
        seen["launch view (root)"] = subprocess.run([*view.prefix, "sh", "-c", f"cd {box.paths.work} && {probe}"],
                                                    capture_output=True, timeout=30).stdout
        assert set(seen) == {"direct", "spawner", "stream", "helper (root)", "launch view (root)"}, seen
        for path, out in seen.items():
            if substrate_class is BareProcess:
                assert b"coding" in out, (path, out)
            else:  # the sandbox's uid is refused; root (a helper) finds the cover empty
                assert out and b"coding" not in out, (path, out)
    finally:
        box.destroy()
        sub.close()


def _read_all(fd: int, timeout: float = 30.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    return out


def test_a_run_refuses_a_suite_its_sandboxes_could_read(suite, run_id, monkeypatch):
    """Where the substrate cannot cover the suite (process without its own view), the run is
    refused before any sandbox exists, in one line naming an answer key's path."""
    from drumsbench.core.errors import UsageError
    from drumsbench.experiments.run import make_substrate

    monkeypatch.setattr(ProcessSubstrate, "make_views", False)
    with pytest.raises(UsageError, match="could read the answer key") as e:
        make_substrate("process", run_id, str(suite))
    message = str(e.value)
    assert "\n" not in message and str(next(suite.glob("*/golden.patch"))) in message, message
    make_substrate("process", run_id).close()  # no suite: nothing to refuse
