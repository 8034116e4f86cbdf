"""The policy is an adversary: what a sandbox command does must not harm the harness, reach
another sandbox, or make the substrate report an infrastructure fault it did not have.

Runs on the real ``process`` substrate (own uid per sandbox, freezer cgroup) and, where the same
machinery applies (freezer, end_processes, probe, exec's failures), on ``bwrap`` and ``overlay``."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import Freezable, Sandbox, Substrate
from drumsbench.substrates.bwrap import BwrapSubstrate
from drumsbench.substrates.hostproc import FreezerCgroup, UidLease
from drumsbench.substrates.overlay.sandbox import OverlaySandbox, OverlaySubstrate
from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate

from conftest import require

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-sandbox uids and cgroups need root")
needs_freezer = pytest.mark.skipif(FreezerCgroup.hierarchy() is None, reason="no writable cgroup v1 freezer")


def _make(kind: str, state_dir: Path) -> Substrate:
    run = f"adv-{secrets.token_hex(3)}"
    if kind == "bwrap":
        require(BwrapSubstrate.missing())
        return BwrapSubstrate(run, state_dir)
    if kind == "overlay":
        require(OverlaySubstrate.missing())
        return OverlaySubstrate(run, state_dir)
    return ProcessSubstrate(run, state_dir)


@pytest.fixture(params=["process", "bwrap", "overlay"])
def sub(request, state_dir: Path) -> Iterator[Substrate]:
    s = _make(request.param, state_dir)
    yield s
    s.close()


@pytest.fixture
def proc_sub(state_dir: Path) -> Iterator[ProcessSubstrate]:
    s = ProcessSubstrate(f"adv-{secrets.token_hex(3)}", state_dir)
    yield s
    s.close()


def _state(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return None
    return None


def _pids_with_cmdline(needle: bytes) -> list[int]:
    found = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                if needle in Path(f"/proc/{e}/cmdline").read_bytes():
                    found.append(int(e))
            except OSError:
                pass
    return found


def _started(needle: bytes, timeout: float = 5.0) -> list[int]:
    """The processes whose command line starts with ``needle``, waited for: a background command
    is found only once it has executed its final program. Before that its command line is its
    parent's (``nohup\0sleep\0...``) or, within ``execve``, reads empty."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for e in os.listdir("/proc"):
            if e.isdigit():
                try:
                    if Path(f"/proc/{e}/cmdline").read_bytes().startswith(needle):
                        found.append(int(e))
                except OSError:
                    pass
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.02)


def _wait_gone(needle: bytes, timeout: float = 3.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _pids_with_cmdline(needle)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


# Walks the PPid chain from $$ and sends SIGSTOP then SIGKILL to every ancestor and to the
# harness's pid ($1). Never a broadcast. It refuses to act as host root outside a pid namespace
# (a regression of the uid separation must fail the test, not stop the machine).
ANCESTOR_KILLER = r"""
if [ "$(id -u)" = 0 ] && [ -r /proc/$1/status ] && [ "$(ls /proc | grep -c '^[0-9]')" -gt 50 ]; then
    echo RUNS-AS-HOST-ROOT; exit 3
fi
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    p=$(awk '/^PPid:/ {print $2}' /proc/$p/status 2>/dev/null)
    [ -n "$p" ] && [ "$p" -gt 0 ] || break
    if kill -STOP "$p" 2>/dev/null; then echo "stopped $p"; else echo "stop $p refused"; fi
    if kill -KILL "$p" 2>/dev/null; then echo "killed $p"; else echo "kill $p refused"; fi
done
cat /proc/$1/environ > /dev/null 2>&1 && echo "read harness environ" || echo "environ refused"
kill -STOP "$1" 2>/dev/null && echo "stopped harness $1" || echo "stop harness refused"
kill -KILL "$1" 2>/dev/null && echo "killed harness $1" || echo "kill harness refused"
echo done
"""


@needs_root
def test_command_cannot_stop_or_kill_its_ancestors_or_the_harness(sub: Substrate) -> None:
    box = sub.create()
    try:
        if isinstance(box, ProcessSandbox):
            assert box.uid is not None and box.uid >= 2_000_000
        me = os.getpid()
        res = box.exec(["/bin/sh", "-c", ANCESTOR_KILLER, "killer", str(me)], timeout=20)
        out = res.stdout.decode()
        assert not res.timed_out
        assert "RUNS-AS-HOST-ROOT" not in out
        assert _state(me) in ("R", "S", "D"), _state(me)
        assert "stopped harness" not in out and "killed harness" not in out
        if isinstance(box, ProcessSandbox):
            # the chain from $$ reaches the harness itself (the command's parent): refused
            assert f"stop {me} refused" in out and f"kill {me} refused" in out, out
            assert "environ refused" in out  # ptrace-mode access to the harness is denied too
            assert "done" in out
        # the harness goes on using the sandbox
        assert box.exec("echo alive", timeout=10).stdout == b"alive\n"
    finally:
        box.destroy()


@needs_root
def test_a_sandbox_cannot_read_or_signal_another_sandbox(proc_sub: ProcessSubstrate) -> None:
    a, b = proc_sub.create(), proc_sub.create()
    try:
        token = f"CANARY-{secrets.token_hex(8)}"
        a.write_file(f"{a.paths.home}/.drumsbench-canary", token.encode())
        assert a.exec("cat \"$HOME/.drumsbench-canary\"", timeout=10).stdout == token.encode()
        res = b.exec(f"cat {a.paths.home}/.drumsbench-canary; ls {a.paths.home} {a.paths.work}", timeout=10)
        assert token.encode() not in res.stdout + res.stderr
        assert res.exit_code != 0 and b"Permission denied" in res.stderr
        # b cannot write into a's folders either
        res = b.exec(f"echo x > {a.paths.work}/planted", timeout=10)
        assert res.exit_code != 0
        with pytest.raises(FileNotFoundError):
            a.read_file(f"{a.paths.work}/planted")
        # nor signal a's processes
        marker = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(1000)}"
        a.exec(f"sleep {marker} > /dev/null 2>&1 &", timeout=10)
        victims = _started(f"sleep\0{marker}".encode())
        assert victims
        res = b.exec(f"kill -KILL {victims[0]}; kill -STOP {victims[0]}", timeout=10)
        assert res.exit_code != 0
        assert _state(victims[0]) in ("S", "R")
    finally:
        a.destroy()
        b.destroy()


@needs_root
def test_write_file_never_follows_a_planted_link_out_of_the_sandbox(proc_sub: ProcessSubstrate) -> None:
    box = proc_sub.create()
    try:
        box.exec("ln -s /etc/hostname link; ln -s /etc out", timeout=10)
        with pytest.raises(FileNotFoundError):
            box.read_file(f"{box.paths.work}/link")
        before = Path("/etc/hostname").read_bytes()
        # resolved inside the sandbox folder (where <root>/etc does not exist): refused, not followed
        with pytest.raises(SubstrateError):
            box.write_file(f"{box.paths.work}/out/hostname", b"pwned")
        assert Path("/etc/hostname").read_bytes() == before
        # what the harness writes belongs to the sandbox: the command can change it
        box.write_file(f"{box.paths.verify}/deep/f.txt", b"1")
        assert box.exec(f"echo 2 >> {box.paths.verify}/deep/f.txt && rm -r {box.paths.verify}/deep",
                        timeout=10).exit_code == 0
    finally:
        box.destroy()


@needs_root
@needs_freezer
def test_freeze_makes_exec_time_out_and_probe_names_the_freeze(sub: Substrate) -> None:
    box = sub.create()
    try:
        assert isinstance(box, Freezable)
        assert box.probe() is None
        box.exec("echo before > f", timeout=10)
        box.freeze()
        t0 = time.monotonic()
        res = box.exec("echo frozen", timeout=1)
        assert res.timed_out and res.stdout == b""
        assert time.monotonic() - t0 < 4.0
        evidence = box.probe(timeout=1)
        assert evidence is not None and "froze" in evidence and "FROZEN" in evidence
        box.thaw()
        assert box.probe() is None
        assert box.exec("cat f", timeout=10).stdout == b"before\n"
    finally:
        box.destroy()


@needs_root
@needs_freezer
def test_a_policy_stopping_itself_is_not_evidence(proc_sub: ProcessSubstrate) -> None:
    box = proc_sub.create()
    try:
        box.exec("sh -c 'kill -STOP $$; sleep 1' > /dev/null 2>&1 &", timeout=10)
        assert box.cgroup is not None
        deadline = time.monotonic() + 3
        while not any(_state(p) == "T" for p in box.cgroup.procs()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert any(_state(p) == "T" for p in box.cgroup.procs()), "the policy's process did not stop"
        assert box.probe(timeout=2) is None
        # nor can the policy freeze its cgroup itself
        res = box.exec(f"echo FROZEN > {box.cgroup.path}/freezer.state", timeout=5)
        assert res.exit_code != 0
        assert box.probe(timeout=2) is None
    finally:
        box.destroy()


@needs_root
@needs_freezer
def test_destroy_of_a_frozen_sandbox_leaves_nothing(sub: Substrate) -> None:
    box = sub.create()
    assert isinstance(box, Freezable)
    marker = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(1000)}"
    box.exec(f"env -i setsid nohup sleep {marker} > /dev/null 2>&1 &", timeout=10)
    cgroup = box.cgroup  # type: ignore[attr-defined]
    box.freeze()
    box.destroy()
    assert not cgroup.exists()
    assert _wait_gone(f"sleep\0{marker}".encode()) == []
    assert sub.leftovers() == []
    assert not UidLease.of_runs({sub.run_id})
    with pytest.raises(SubstrateError):
        box.exec("true", timeout=5)


@needs_root
def test_end_processes_kills_what_left_its_session(sub: Substrate) -> None:
    box = sub.create()
    try:
        marker = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(1000)}"
        # bwrap's background processes die with their command anyway; process and overlay keep them
        res = box.exec(f"env -i setsid nohup sleep {marker} > /dev/null 2>&1 & echo started", timeout=10)
        assert res.stdout == b"started\n", res
        needle = f"sleep\0{marker}".encode()
        if sub.name != "bwrap":
            assert _started(needle), "the background sleep did not start"
        box.write_file(f"{box.paths.work}/kept", b"kept")
        box.end_processes()
        assert _wait_gone(needle) == []
        assert box.read_file(f"{box.paths.work}/kept") == b"kept"
        usable = box.exec("echo usable", timeout=10)
        assert usable.stdout == b"usable\n", usable
    finally:
        box.destroy()


def test_a_missing_working_folder_is_the_commands_failure_not_the_substrates(sub: Substrate) -> None:
    box: Sandbox = sub.create()
    try:
        # from inside: process refuses (root owns the sandbox folder), bwrap lets it happen
        res = box.exec(f"cd / && rm -rf {box.paths.work}; rmdir {box.paths.work}", timeout=10)
        assert not res.timed_out
        gone = box.exec("true", timeout=10)  # must not raise
        if isinstance(box, ProcessSandbox) and box.uid is not None:
            assert gone.exit_code == 0, "a sandbox uid removed its own work folder"
        else:
            assert gone.exit_code != 0
        assert box.exec("echo ok", timeout=10, cwd=box.paths.home).stdout == b"ok\n"
        assert box.probe() is None
    finally:
        box.destroy()
    with pytest.raises(SubstrateError):
        box.exec("true", timeout=5)


@needs_root
@needs_freezer
def test_gc_of_a_dead_run_removes_frozen_sandboxes_cgroups_and_uid_leases(state_dir: Path) -> None:
    sub = ProcessSubstrate(f"adv-{secrets.token_hex(3)}", state_dir)
    box = sub.create()
    marker = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(1000)}"
    box.exec(f"env -i setsid nohup sleep {marker} > /dev/null 2>&1 &", timeout=10)
    assert isinstance(box, Freezable)
    box.freeze()  # the run "crashes" with a frozen sandbox
    left = sub.leftovers()
    assert any(x.startswith("cgroup ") for x in left) and any(x.startswith("uid lease ") for x in left), left
    removed = ProcessSubstrate.gc(state_dir, {sub.run_id})
    assert any("cgroup" in r for r in removed), removed
    assert _wait_gone(f"sleep\0{marker}".encode()) == []
    assert sub.leftovers() == []


@needs_root
def test_a_lease_whose_folder_vanished_is_swept(proc_sub: ProcessSubstrate) -> None:
    from drumsbench.substrates.hostproc import unmount_below
    from drumsbench.substrates.process import sweep_orphans

    box = proc_sub.create()
    assert isinstance(box, ProcessSandbox) and box.lease is not None
    lease = box.lease.path
    unmount_below(box.host_root)  # its disk bound's tmpfs, and then
    shutil.rmtree(box.host_root)  # its state folder was deleted without a gc
    assert lease.is_symlink()
    assert any(str(lease) in r for r in sweep_orphans())
    assert not lease.is_symlink()
    box.destroy()


@needs_root
def test_a_sandbox_below_the_shared_base_whose_state_folder_vanished_is_swept(tmp_path, run_id) -> None:
    """A run killed without a gc whose state folder cannot be searched by sandbox uids (pytest's
    tmp, ``/root``): its sandboxes live below ``SHARED_BASE``, which outlives the state folder. Once
    that folder is gone and nothing of the run runs, the sweep removes the sandbox's folder, its
    disk-bound tmpfs and its lease; while the state folder exists it keeps them (the control)."""
    from drumsbench.substrates.hostproc import mounts_below
    from drumsbench.substrates.process import SHARED_BASE, sweep_orphans

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    sub = ProcessSubstrate(run_id, state)
    box = sub.create()
    assert isinstance(box, ProcessSandbox) and box.lease is not None and SHARED_BASE in box.host_root.parents
    lease = box.lease.path
    box.kill_all()
    box.stop_helpers()
    assert not any(str(lease) in r for r in sweep_orphans())  # the state folder is there: live
    assert lease.is_symlink() and box.host_root.is_dir()
    shutil.rmtree(state)  # the run "crashed" and its state folder was deleted without a gc
    removed = sweep_orphans()
    assert any(str(lease) in r for r in removed) and any(str(box.host_root) in r for r in removed), removed
    assert not lease.is_symlink() and not box.host_root.exists() and not mounts_below(box.host_root)
    sub.close()


# What a command plants for the next command's entry into its sandbox: every program of the sandbox
# that a privileged entry could run before it drops to the sandbox's privileges (the shell's `env`
# and util-linux's `setpriv`), each replaced by a script that records the capabilities it ran with
# and a tmpfs it could mount, then runs the real program.
PLANT_ENTRY = r"""
for p in /usr/bin/env /usr/bin/setpriv; do
  [ -e "$p.real" ] || mv "$p" "$p.real" 2>/dev/null || continue
  { echo '#!/bin/sh'
    echo 'grep CapEff /proc/self/status > /tmp/entry-ran-privileged'
    echo 'mkdir -p /tmp/m && mount -t tmpfs t /tmp/m && echo mounted >> /tmp/entry-ran-privileged && umount /tmp/m'
    echo "exec $p.real \"\$@\""; } > "$p"
  chmod 755 "$p"
done
echo planted
"""


def _cap_eff(out: bytes) -> int:
    line = next(x for x in out.decode().splitlines() if x.startswith("CapEff:"))
    return int(line.split()[1], 16)


@needs_root
def test_a_command_cannot_plant_a_program_the_next_entry_runs_privileged(sub: Substrate) -> None:
    """The strategy: replace the sandbox's own `env`/`setpriv` so that the next command's entry runs
    them as host root with every capability (then mknod and mount the host's disk). The next command
    keeps the sandbox's capabilities, and nothing planted ran privileged. Positive control (overlay,
    where the sandbox's system is writable): the entry it had, `nsenter -r ... env ... setpriv ...`,
    runs the planted `env` with every capability and mounts."""
    from drumsbench.substrates.overlay import entry

    box: Sandbox = sub.create()
    try:
        box.exec(PLANT_ENTRY, timeout=20)
        res = box.exec("grep CapEff /proc/self/status; mkdir -p /tmp/m2; mount -t tmpfs t /tmp/m2 && echo MOUNTED",
                       timeout=20)
        assert res.exit_code != 0 and b"MOUNTED" not in res.stdout, res
        assert _cap_eff(res.stdout) & ~entry.KEEP_MASK == 0, res.stdout
        assert box.exec("cat /tmp/entry-ran-privileged", timeout=20).exit_code != 0, "a planted program ran"
        if isinstance(box, OverlaySandbox):
            assert box.exec("test -x /usr/bin/env.real", timeout=20).exit_code == 0, "the strategy did not plant"
            pid = box.holder_pid
            naive = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "--", "/usr/bin/env",
                     "--chdir=/sandbox/work", "/usr/bin/setpriv", "--bounding-set=-all,+chown", "--inh-caps=-all",
                     "--no-new-privs", "--", "/bin/true"]
            assert subprocess.run(naive, capture_output=True, timeout=20).returncode == 0
            ran = box.exec("cat /tmp/entry-ran-privileged", timeout=20)
            assert ran.exit_code == 0 and b"mounted" in ran.stdout, ran
            assert _cap_eff(ran.stdout) & ~entry.KEEP_MASK, "the control ran without extra capabilities"
    finally:
        box.destroy()
