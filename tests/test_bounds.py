"""Per-sandbox bounds (pids, memory, disk) on every substrate, proven by the escape probes.

Each bound is probed just above its size with the limits on and again with them off (the positive
control: the probe exceeds the bound there); see ``escape.probe_bounds``. Bounds here are small
(64 processes, 128 MiB, 64 MiB) so that the limits-off control costs little."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.experiments import escape
from drumsbench.substrates import registry
from drumsbench.substrates.base import LIMIT_VARS, SandboxLimits
from drumsbench.substrates.containers.common import disk_source
from drumsbench.substrates.hostproc import limit_hierarchies, mounts_below, mounts_of_source

from conftest import require

SMALL = SandboxLimits(pids=64, memory_mb=128, disk_mb=64)


def test_limits_setting_defaults_off_and_bad_input():
    assert SandboxLimits.from_env({}) == SandboxLimits(2048, 4096, 4096)
    env = {LIMIT_VARS["pids"]: "100", LIMIT_VARS["memory_mb"]: "0", LIMIT_VARS["disk_mb"]: " "}
    assert SandboxLimits.from_env(env) == SandboxLimits(100, None, 4096)
    # the disk bound enforced stays below the memory bound by the verifier's reserve (never below half)
    assert SandboxLimits().disk_bound_mb == 3584 and "kept 512 MiB below" in SandboxLimits().describe()
    assert SandboxLimits(64, 128, 64).disk_bound_mb == 64 and SandboxLimits(64, 128, 100).disk_bound_mb == 64
    assert SandboxLimits(100, None, 4096).disk_bound_mb == 4096 and SandboxLimits(1, 1024, None).disk_bound_mb is None
    for bad in ("-1", "lots", "1.5"):
        with pytest.raises(UsageError) as e:
            SandboxLimits.from_env({LIMIT_VARS["disk_mb"]: bad})
        assert str(e.value).startswith(f"{LIMIT_VARS['disk_mb']}={bad!r}") and "0 turns the bound off" in str(e.value)


def _needs_cgroups() -> None:
    if os.geteuid() != 0 or limit_hierarchies() is None:
        pytest.skip("needs root and the cgroup v1 pids and memory hierarchies")


@pytest.mark.parametrize("name", ["process", "bwrap", "overlay"])
def test_host_substrate_bounds_hold_and_their_controls_fire(name: str, state_dir: Path, run_id: str):
    cls = registry.get(name)
    require(cls.missing())
    _needs_cgroups()
    sub = cls(run_id, state_dir)
    sub.limits = SMALL
    try:
        results = {r.bound: r for r in escape.probe_bounds(sub)}
        assert set(results) == {"pids", "memory_mb", "disk_mb"}
        for r in results.values():
            assert r.verdict == "bounded", r
            assert r.off.ran and r.off.contained is False, r  # the control exceeded the bound
            assert not r.mechanism.startswith("not enforced"), r
        disk = results["disk_mb"]
        assert "No space left" in disk.on.detail, disk  # its own limit's ENOSPC
        before, full = disk.host_free_mb or (0, 0)
        assert full > 1024 and before - full < 32, disk  # the host's file system kept its room
        assert f"of {results['pids'].size} processes started, then a fork failed" in results["pids"].on.detail
        assert "OOM" in results["memory_mb"].on.detail or "MemoryError" in results["memory_mb"].on.detail
    finally:
        sub.close()
    assert sub.leftovers() == []


def test_limits_off_make_no_mount_and_no_limit_group(state_dir: Path, run_id: str):
    _needs_cgroups()
    sub = registry.get("process")(run_id, state_dir)
    sub.limits = SandboxLimits.off()
    box = sub.create()
    try:
        assert mounts_below(box.host_root) == []
        assert box.cgroup is not None and box.cgroup.limit_dirs == []
        assert all(v == "off (setting)" for v in sub.limit_mechanisms().values())
    finally:
        box.destroy()
        sub.close()
    sub.limits = SMALL
    box = sub.create()
    try:
        assert mounts_below(box.host_root) == [str(box.host_root)]
        assert box.cgroup is not None and len(box.cgroup.limit_dirs) == 2
        assert box.cgroup.limit_state()["pids.max"] == "64"
        assert box.cgroup.limit_state()["memory.limit_in_bytes"] == str(128 << 20)
    finally:
        box.destroy()
        sub.close()
    assert sub.leftovers() == [] and mounts_below(box.host_root) == []


@pytest.mark.parametrize("name", ["docker", "podman"])
def test_container_bounds(name: str, state_dir: Path, run_id: str, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch):
    """pids, memory and disk are bounded (the disk by the storage's quota where it takes one, else by
    a tmpfs over the container's layer folder), each control exceeding its bound; nothing appears in
    the harness's working folder (podman's conmon once wrote an ``oom`` marker there)."""
    cls = registry.get(name)
    require(cls.missing())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    sub = cls(run_id, state_dir)
    sub.limits = SMALL
    try:
        results = {r.bound: r for r in escape.probe_bounds(sub)}
        for bound in ("pids", "memory_mb"):
            assert results[bound].verdict == "bounded", results[bound]
        disk = results["disk_mb"]
        assert disk.off.ran and disk.off.contained is False, disk
        assert not disk.mechanism.startswith("not enforced"), disk
        assert disk.verdict == "bounded" and "No space left" in disk.on.detail, disk
        before, full = disk.host_free_mb or (0, 0)
        assert full > 1024 and before - full < 32, disk  # the host's file system kept its room
    finally:
        sub.close()
    assert sub.leftovers() == []
    assert not mounts_of_source(disk_source(run_id)), "a disk-bound tmpfs outlived its container"
    assert list(cwd.iterdir()) == [], "a sandbox's OOM wrote into the harness's working folder"


def test_vm_guest_bounded_by_the_host(state_dir: Path, run_id: str):
    """The guest's memory is bounded by QEMU's host cgroup (below the guest's RAM: the host kills
    QEMU, and the gate's probe says so); above it the guest's own OOM killer stops a hog. The guest's
    disk fills at ENOSPC of its fixed-size disk, and the host file stays below the virtual size."""
    cls = registry.get("vm")
    require(cls.missing())
    _needs_cgroups()
    sub = cls(run_id, state_dir)
    try:
        box = sub.create()
        try:
            assert box.cgroup is not None and box.cgroup.limit_state()["memory.limit_in_bytes"] == str(4096 << 20)
            hog = escape._memory_hog(box, box, None, 700)
            assert hog.ran and hog.contained, hog  # the guest's own bound (512 MiB of RAM)
            fill = escape._fill_disk(box, box, None, 2400, timeout=900)  # ~1.6 GiB under TCG
            assert fill.ran and fill.contained and "No space left" in fill.detail, fill
            virtual = int(sub.limit_mechanisms()["disk_mb"].split()[0])
            assert os.path.getsize(box.vm.disk) >> 20 < virtual
        finally:
            box.destroy()
        sub.limits = SandboxLimits(2048, 400, None)
        box = sub.create()
        try:
            with pytest.raises(Exception, match="VM exited"):
                escape._memory_hog(box, box, None, 450)
            assert "killed by signal 9" in (box.probe() or "")
            state = box.cgroup.limit_state() if box.cgroup else {}
            assert int(state["memory.failcnt"]) > 0 and int(state["memory.max_usage_in_bytes"]) <= 400 << 20
        finally:
            box.destroy()
    finally:
        sub.close()
    assert sub.leftovers() == []


@pytest.mark.parametrize("pool,verifier", [("off", "kept"), ("auto", "kept"), ("off", "judge")])
def test_a_policy_that_fills_its_disk_bound_fails_never_invalid(pool: str, verifier: str, tmp_path: Path):
    """The red team's ``fill_disk`` under a 32 MiB bound. In-process, the verifier cannot be staged on
    the full disk. That is the policy's doing (its own writes filled its own bound) — failed with the
    reason, the sandbox destroyed — never invalid (the attempt used to end invalid/substrate_failure:
    an escape from a 0). With and without the warm pool (its substrate reports the inner's bounds).
    The judge stages nothing in the sandbox: the tests run on the full disk and fail."""
    import sqlite3

    from helpers import cli

    _needs_cgroups()
    out = tmp_path / "runs"
    cli("run", "--substrate", "process", "--tasks", "coding", "--policy", "adversary:fill_disk", "--attempts", "2",
        "--concurrency", "1", "--pool", pool, "--verifier", verifier, "--out", str(out), "--no-progress", check=True,
        env={"DRUMSBENCH_STATE": str(tmp_path / "state"), LIMIT_VARS["disk_mb"]: "32"})
    rows = sqlite3.connect(out / "ledger.sqlite").execute("SELECT outcome, cause, detail FROM attempts").fetchall()
    assert len(rows) == 2, rows
    said = "disk bound was full" if verifier == "kept" else "expected tests passed"
    for outcome, cause, detail in rows:
        assert (outcome, cause) == ("failed", None) and said in detail, (outcome, cause, detail)
