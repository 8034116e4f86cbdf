"""The process substrate's spawner (``substrates/spawner.py``): commands born inside the sandbox's
cgroups behave exactly as commands that join them, and nothing of the sandbox reaches the spawner.

Runs on the real ``process`` substrate (root, cgroup v1 freezer, a uid per sandbox)."""

from __future__ import annotations

import os
import time

import pytest

from drumsbench.substrates.base import ExecResult, Freezable
from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate
from drumsbench.substrates.spawner import Spawner


def _ready(box: ProcessSandbox) -> Spawner:
    """The sandbox's spawner once it is ready (the first command starts it in the background)."""
    box.exec(["true"], timeout=10)
    deadline = time.monotonic() + 10
    while True:
        spawner = box._spawner
        if spawner is not None and spawner.usable():
            return spawner
        assert time.monotonic() < deadline, "the process sandbox has a cgroup and a uid: it keeps a spawner"
        assert spawner is None or not spawner.failed, "the spawner failed"
        time.sleep(0.01)


@pytest.fixture
def boxes(state_dir, run_id):
    """Two sandboxes of one run: one starts its commands through the spawner, one the old way."""
    sub = ProcessSubstrate(run_id, state_dir)
    spawned, joined = sub.create(), sub.create()
    assert isinstance(spawned, ProcessSandbox) and isinstance(joined, ProcessSandbox)
    joined.spawns_inside = False  # type: ignore[misc]
    _ready(spawned)
    yield spawned, joined
    for box in (spawned, joined):
        box.destroy()
    sub.close()
    assert sub.leftovers() == []


def _same(a: ExecResult, b: ExecResult) -> tuple:
    return a.exit_code, a.stdout, a.stderr, a.timed_out


# Outputs that differ only by the sandbox's own id, uid and paths are normalised by the caller.
COMMANDS = [
    (["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], None),
    (["cat"], b"from stdin\n"),
    (["/bin/sh", "-c", "kill -9 $$"], None),
    (["/bin/sh", "-c", "ls /proc/self/fd | sort -n | tr '\\n' ' '"], None),
    (["/bin/sh", "-c", "test $(ps -o sid= -p $$) -eq $$ && echo own session"], None),
    (["/bin/sh", "-c", "env | grep -v -e ^DRUMSBENCH_SANDBOX= -e ^HOME= -e ^TMPDIR= -e ^PWD= | sort"], None),
    (["/bin/sh", "-c", "cat /proc/self/oom_score_adj; grep -c NoNewPrivs:.0 /proc/self/status"], None),
]


@pytest.mark.parametrize("i", range(len(COMMANDS)))
def test_a_spawned_command_behaves_as_a_joined_one(boxes, i):
    spawned, joined = boxes
    argv, stdin = COMMANDS[i]
    a = spawned.exec(argv, timeout=10, stdin=stdin)
    b = joined.exec(argv, timeout=10, stdin=stdin)
    assert _same(a, b), (a, b)


def test_identity_groups_and_cgroups_are_the_sandboxs(boxes):
    spawned = boxes[0]
    for box in boxes:
        res = box.exec(["/bin/sh", "-c", "id -u; id -g; id -G; pwd; cat /proc/self/cgroup"], timeout=10)
        lines = res.stdout.decode().splitlines()
        assert lines[:3] == [str(box.uid)] * 3, lines
        assert lines[3] == box.paths.work
        assert box.cgroup is not None
        groups = "\n".join(lines[4:])
        for path in box.cgroup.procs_files:  # freezer, pids, memory: the sandbox's own groups
            assert path.split("/")[4] + ":" in groups or path.split("/")[4] in groups
            rel = os.path.dirname(path).split("/", 5)[5]
            assert f"/{rel}" in groups, (rel, groups)
    res = spawned.exec(["/bin/sh", "-c", "echo $PPID"], timeout=10)
    spawner = spawned._spawner
    assert spawner is not None and int(res.stdout) == spawner.pid  # born of the spawner, not the harness


def test_missing_command_and_folder_are_the_commands_outcome(boxes):
    for box in boxes:
        res = box.exec(["no-such-command-here"], timeout=10)
        assert res.exit_code == 127 and b"no-such-command-here" in res.stderr, res
        gone = box.exec(["true"], timeout=10, cwd=f"{box.paths.work}/gone")
        assert gone.exit_code == 126 and b"does not exist" in gone.stderr, gone


def test_a_timeout_kills_the_commands_whole_group(boxes):
    spawned, _ = boxes
    res = spawned.exec(["/bin/sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)
    assert res.timed_out and res.exit_code == -9, res
    time.sleep(0.2)
    assert spawned.cgroup is not None
    spawner = spawned._spawner
    assert spawner is not None
    assert set(spawned.cgroup.procs()) == {spawner.pid}, "the background sleep died with its group"


def test_the_sandbox_cannot_reach_its_spawner(boxes):
    spawned, _ = boxes
    spawner = spawned._spawner
    assert spawner is not None
    pid = spawner.pid
    res = spawned.exec(["/bin/sh", "-c", f"kill -9 {pid}; echo kill=$?; ls /proc/{pid}/fd 2>&1; "
                        f"cat /proc/{pid}/environ >/dev/null 2>&1; echo environ=$?"], timeout=10)
    out = res.stdout.decode()
    assert "kill=1" in out and "Permission denied" in out and "environ=1" in out, out
    assert spawner.usable() and spawned.exec(["true"], timeout=10).exit_code == 0
    spawner2 = spawned._spawner
    assert spawner2 is spawner  # the same spawner still serves


def test_end_processes_and_reset_spare_the_spawner_destroy_stops_it(state_dir, run_id):
    sub = ProcessSubstrate(run_id, state_dir)
    box = sub.create()
    assert isinstance(box, ProcessSandbox) and box.cgroup is not None
    try:
        spawner = _ready(box)
        box.exec(["/bin/sh", "-c", "setsid sleep 30 >/dev/null 2>&1 &"], timeout=10)
        assert len(box.cgroup.procs()) == 2
        box.end_processes()
        assert box.cgroup.procs() == [spawner.pid]
        box.reset_in_place()
        assert box.cgroup.procs() == [spawner.pid] and not spawner.failed
        assert box.exec(["true"], timeout=10).exit_code == 0 and box._spawner is spawner
    finally:
        box.destroy()
    assert spawner.failed
    with pytest.raises(ProcessLookupError):
        os.kill(spawner.pid, 0)
    sub.close()
    assert sub.leftovers() == []


def test_a_frozen_sandbox_times_out_through_the_spawner_and_says_why(state_dir, run_id):
    sub = ProcessSubstrate(run_id, state_dir)
    box = sub.create()
    assert isinstance(box, ProcessSandbox)
    try:
        spawner = _ready(box)
        assert isinstance(box, Freezable)
        box.freeze()
        res = box.exec(["true"], timeout=1.0)
        assert res.timed_out, res
        assert spawner.failed  # a spawner that answers late must never start a command late
        assert "froze" in (box.probe() or ""), box.probe()
        box.thaw()
        assert box.exec(["echo", "back"], timeout=10).stdout == b"back\n"  # a new spawner, or the old way
    finally:
        box.destroy()
        sub.close()
    assert sub.leftovers() == []
