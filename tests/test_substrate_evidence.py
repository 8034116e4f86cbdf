"""Gate-side evidence (``Sandbox.probe``), the injector's host-level freeze (``Freezable``),
``Sandbox.end_processes`` and the canary scan's secrecy, on real docker, podman and vm sandboxes.

Consistent behaviour of a frozen sandbox on every substrate here: ``exec`` **raises
SubstrateError** (docker and podman refuse an exec into a paused container at once; the vm's agent
does not answer, so the call raises after its timeout plus the agent slack) and ``probe()`` names
the pause. What the policy can do from inside (stop its own processes, power its guest off) is
never evidence.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.rollout.isolation import CANARY_FILE, plant
from drumsbench.substrates import registry
from drumsbench.substrates.base import Freezable

from conftest import require

ENGINES = ["docker", "podman"]


@pytest.fixture(params=ENGINES)
def sub(request, run_id, state_dir):
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls(run_id, state_dir)
    yield s
    s.close()
    cls.gc(state_dir, {run_id})


def host_kill(sub, box) -> None:
    """SIGKILL the container's init from the host (as an OOM kill or an operator would)."""
    if sub.name == "docker":
        sub.client.api.kill(box.container_id, signal="KILL")
    else:
        from drumsbench.substrates.containers.podman_cli import podman

        podman(["kill", "--signal", "KILL", box.container_id])


def pids_of(box, pattern: str) -> list[str]:
    res = box.exec(["sh", "-c", f"pgrep -f -x '{pattern}' || true"], timeout=30)
    return res.stdout.decode().split()


# -- freeze, probe, thaw ---------------------------------------------------------------------------
def test_frozen_exec_raises_probe_names_pause_thaw_restores(sub):
    box = sub.create()
    try:
        assert isinstance(box, Freezable)
        assert box.probe() is None
        box.freeze()
        t0 = time.monotonic()
        with pytest.raises(SubstrateError):
            box.exec(["true"], timeout=2)
        assert time.monotonic() - t0 < 10
        found = box.probe(timeout=2)
        assert found is not None and "paused" in found, found
        box.thaw()
        box.thaw()  # idempotent
        assert box.probe() is None
        res = box.exec("echo back", timeout=30)
        assert res.exit_code == 0 and res.stdout == b"back\n", res
    finally:
        box.destroy()


def test_init_killed_from_host_is_evidence_at_the_first_probe(sub):
    """An exec that ends because the container was killed from the host: the first probe after it
    names the stop, though the engine records it after the processes died (it waits for the
    record while the container's pid 1 is dead on the host)."""
    box = sub.create()
    try:
        ended: list = []
        t = threading.Thread(target=lambda: ended.append(box.exec(["sleep", "60"], timeout=90)))
        t.start()
        time.sleep(1.0)
        host_kill(sub, box)
        t.join(60)
        assert ended and ended[0].exit_code != 0, ended
        found = box.probe(timeout=2)
        assert found is not None and "not running" in found, found
    finally:
        box.destroy()


def test_policy_stopping_its_own_process_is_not_evidence(sub):
    box = sub.create()
    try:
        res = box.exec("sleep 1000 >/dev/null 2>&1 & kill -STOP $!; echo $!", timeout=30)
        assert res.exit_code == 0, res
        pid = res.stdout.decode().strip()
        state = box.exec(["sh", "-c", f"cut -d' ' -f3 /proc/{pid}/stat"], timeout=30).stdout.strip()
        assert state == b"T", state
        assert box.probe(timeout=5) is None
    finally:
        box.destroy()


# -- end_processes ---------------------------------------------------------------------------------
def test_end_processes_kills_leftovers_keeps_files(sub):
    box = sub.create()
    try:
        res = box.exec(
            "echo kept > /sandbox/work/f; echo t > /sandbox/tmp/t; "
            "setsid nohup sleep 1000 >/dev/null 2>&1 & (sleep 999 >/dev/null 2>&1 &); true",
            timeout=30,
        )
        assert res.exit_code == 0, res
        assert pids_of(box, "sleep 1000") and pids_of(box, "sleep 999")
        box.end_processes()
        assert pids_of(box, "sleep 1000") == [] and pids_of(box, "sleep 999") == []
        assert box.read_file("/sandbox/work/f") == b"kept\n"
        assert box.read_file("/sandbox/tmp/t") == b"t\n"
        init = box.exec(["cat", "/proc/1/cmdline"], timeout=30).stdout
        assert b"waitpid" in init, init  # pid 1 is still the reaper
        assert box.probe() is None
    finally:
        box.destroy()


def test_destroy_of_frozen_sandbox_leaves_nothing(sub):
    box = sub.create()
    box.exec("sleep 1000 >/dev/null 2>&1 &", timeout=30)
    box.freeze()
    box.destroy()
    box.destroy()
    assert sub.leftovers() == []


# -- canary secrecy ----------------------------------------------------------------------------------
class HostWatcher:
    """Looks for tokens on the host while it runs: in files under /tmp, /var/tmp and /dev/shm (top
    level each round, whole trees every tenth), and on every host process's command line."""

    PLACES = ("/tmp", "/var/tmp", "/dev/shm")

    def __init__(self, tokens: list[str]) -> None:
        self.needles = {t: t.encode() for t in tokens}
        self.seen: dict[str, str] = {}
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HostWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _check(self, path: str, data: bytes) -> None:
        for t, n in self.needles.items():
            if n in data:
                self.seen.setdefault(t, path)

    def _file(self, path: str) -> None:
        try:
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > (1 << 20):
                return
            with open(path, "rb") as f:
                self._check(path, f.read())
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.is_set() or self.rounds < 2:
            deep = self.rounds % 10 == 0
            for place in self.PLACES:
                if deep:
                    for dirpath, _dirs, files in os.walk(place):
                        for name in files:
                            self._file(os.path.join(dirpath, name))
                else:
                    try:
                        names = os.listdir(place)
                    except OSError:
                        continue
                    for name in names:
                        self._file(os.path.join(place, name))
            for d in os.listdir("/proc"):
                if d.isdigit():
                    for what in ("cmdline", "environ"):
                        try:
                            with open(f"/proc/{d}/{what}", "rb") as f:
                                self._check(f"/proc/{d}/{what}", f.read())
                        except OSError:
                            pass
            self.rounds += 1


def test_scan_tokens_never_reach_the_host(sub):
    """Plant and scan with canary tokens while another exec runs in the same sandbox: no token is
    ever in a host file or on a host command line. The control (a token passed as an argument, as
    the scan used to) is seen by the same watcher, so the watcher can see."""
    own = f"DRUMSCANARY-{secrets.token_hex(8)}"
    others = [f"DRUMSCANARY-{secrets.token_hex(8)}" for _ in range(3)]
    control = f"DRUMSCONTROL-{secrets.token_hex(8)}"
    box = sub.create()
    try:
        with HostWatcher([own, *others, control]) as watcher:
            busy = threading.Thread(target=lambda: box.exec("sleep 4", timeout=30), daemon=True)
            busy.start()
            plant(box, own)
            box.write_file(f"{box.paths.tmp}/from-neighbour", others[1].encode())
            for _ in range(5):
                hits = box.scan([box.paths.work, box.paths.home, box.paths.tmp], [own, *others])
                assert hits == {own, others[1]}, hits
            assert box.scan([box.paths.work], others) == set()
            busy.join(30)
            deadline = time.monotonic() + 30
            while control not in watcher.seen and time.monotonic() < deadline:
                box.exec(["python3", "-c", "import time; time.sleep(0.3)", control], timeout=30)
        assert control in watcher.seen, f"the watcher never saw the control token ({watcher.rounds} rounds)"
        leaked = {t: p for t, p in watcher.seen.items() if t != control}
        assert leaked == {}, f"canary tokens reached the host: {leaked} (control seen at {watcher.seen[control]})"
        assert box.read_file(f"{box.paths.home}/{CANARY_FILE}") == own.encode()
    finally:
        box.destroy()


# -- vm (few: each is a fork of the booted snapshot) ----------------------------------------------
@pytest.fixture
def vm(run_id: str, state_dir: Path):
    from drumsbench.substrates.vm.sandbox import VmSubstrate

    require(VmSubstrate.missing())
    s = VmSubstrate(run_id, state_dir)
    try:
        yield s
    finally:
        s.close()
        assert not s.leftovers()


def test_vm_end_processes_freeze_probe_thaw_destroy(vm):
    box = vm.create()
    try:
        # a policy's own stopped background process, and one that escaped into its own session
        res = box.exec(
            "echo kept > /sandbox/work/f; setsid nohup sleep 1000 >/dev/null 2>&1 & "
            "setsid nohup sleep 999 >/dev/null 2>&1 & true",
            timeout=60,
        )
        assert res.exit_code == 0, res
        res = box.exec("kill -STOP $(pgrep -f -x 'sleep 999')", timeout=60)
        assert res.exit_code == 0, res
        assert pids_of(box, "sleep 1000") and pids_of(box, "sleep 999")
        assert box.probe() is None  # the policy stopping its own process is no evidence
        box.end_processes()
        assert pids_of(box, "sleep 1000") == [] and pids_of(box, "sleep 999") == []
        assert box.read_file("/sandbox/work/f") == b"kept\n"
        box.freeze()
        found = box.probe(timeout=2)
        assert found is not None and "paused" in found, found
        with pytest.raises(SubstrateError):
            box.exec(["true"], timeout=2)  # the agent cannot answer: raises after timeout + slack
        box.thaw()
        box.thaw()
        assert box.probe() is None
        assert box.exec("echo back", timeout=60).stdout == b"back\n"
        box.freeze()
    finally:
        box.destroy()  # frozen: destroy still leaves nothing (the fixture checks leftovers())
    assert not [x for x in vm.leftovers() if box.id in x]


def test_vm_qemu_death_host_kill_is_evidence_guest_poweroff_is_not(vm):
    a, b = vm.create(), vm.create()
    try:
        os.kill(a.vm.proc.pid, 9)
        a.vm.proc.wait(timeout=30)
        found = a.probe(timeout=2)
        assert found is not None and "signal 9" in found, found
        with contextlib.suppress(SubstrateError):  # the VM may be gone before the agent answers
            b.exec("sync; echo o > /proc/sysrq-trigger", timeout=20)  # root in the guest powers off
        b.vm.proc.wait(timeout=60)
        assert b.probe(timeout=2) is None, b.vm.qmp.shutdown
    finally:
        a.destroy()
        b.destroy()
