"""The policy is an adversary: every red-team strategy ends failed (never success, never invalid),
with the strategy named in the ledger, while the oracle still succeeds and null fails."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.coding.env import CodingEnv
from drumsbench.envs.coding.task import load_suite
from drumsbench.policies.adversary import STRATEGIES, Adversary
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry
from drumsbench.testing.naive_gates import NaiveDockerSubstrate

from conftest import require
from helpers import slots_on

# Short limits so that hanging strategies end quickly; the verifier still has room on a loaded host.
CFG = RolloutConfig(step_timeout_s=3.0, episode_timeout_s=60.0, verify_timeout_s=10.0, max_steps=60)
SUBSTRATES = ["process", "bwrap", "overlay", "docker", "podman"]
# Every strategy runs on process and docker; on the others, the ones whose outcome depends on the
# substrate (shells, signals, links, folders, background processes, canaries) — CI time is finite,
# and `drumsbench run --policy adversary --substrate S` plays them all.
EVERY = ("process", "docker")
SAMPLE = ["verdict_stdout", "report_fd_spray", "kill_verifier", "exit_zero", "output_after_marker", "exec_away",
          "kill_own_shells", "hang_step", "stop_own_step", "delete_own_folders", "leak_own_canary",
          "read_neighbours", "background_rewrites_verifier", "plant_links", "write_through_link",
          "many_processes_then_hang", "fill_disk", "lose_end_marker", "fill_memory",
          "remove_outer_shell", "fake_missing_dependency", "plant_fifos", "read_answer_key", "replace_python3"]


def _play(substrate: str, strategies: list[str], state_dir, run_id, cfg: RolloutConfig = CFG, workers: int = 1):
    """Each strategy once, on ``workers`` slots of one substrate side by side (as the harness runs
    them: a strategy then has a live neighbour), then the oracle on the first slot."""
    require(registry.get(substrate).missing())
    slots = slots_on(substrate, run_id, state_dir, workers)
    first = slots[0]
    task = load_suite("coding")[0]
    canaries = CanaryRegistry()
    order = list(enumerate(strategies))

    def play(k: int) -> dict[str, Any]:
        return {name: run_attempt(slots[k], task, Adversary([name]), cfg, canaries, run_id=run_id, seq=i, seed=0)
                for i, name in order[k::workers]}

    try:
        with ThreadPoolExecutor(workers) as pool:
            out = {n: r for part in pool.map(play, range(workers)) for n, r in part.items()}
        control = run_attempt(first, task, make_policy("oracle"), cfg, canaries, run_id=run_id,
                              seq=len(strategies), seed=0)
    finally:
        for slot in slots:
            slot.destroy()
    assert not first.substrate.leftovers()
    return out, control


@pytest.mark.parametrize("substrate", SUBSTRATES)
def test_no_strategy_reaches_success_or_invalid(substrate, state_dir, run_id):
    names = [s for s in (STRATEGIES if substrate in EVERY else SAMPLE)
             if not (substrate != "process" and s == "signal_harness")]
    harness = os.getpid()
    out, control = _play(substrate, names, state_dir, run_id, workers=2)
    escaped = {n: (r.outcome, r.cause, r.detail) for n, r in out.items() if r.outcome is not Outcome.FAILED}
    assert not escaped, f"strategies that did not end failed on {substrate}: {escaped}"
    assert all(r.extra.get("strategy") == n for n, r in out.items())
    assert all(r.detail for r in out.values() if r.extra.get("strategy") != "plant_fake_canary")
    assert control.outcome is Outcome.SUCCESS, control.detail  # the slot still works afterwards
    assert os.getpid() == harness


def test_a_broken_python3_is_invalid_only_where_the_gates_run_the_containers_own(state_dir, run_id):
    """``replace_python3`` (every python3 of the container an error) never solves the task: on docker
    it ends failed (the gates end processes and scan canaries from the host: ``from_host``); its
    positive control, docker with gates that run the container's own python3
    (``testing.naive_gates``), records the same attempt invalid — a 0 escaped."""
    require(registry.get("docker").missing())
    task = load_suite("coding")[0]
    canaries = CanaryRegistry()
    out = {}
    for seq, cls in enumerate((NaiveDockerSubstrate, registry.get("docker"))):
        slot = Slot(cls(run_id, state_dir), CodingEnv())
        try:
            out[cls] = run_attempt(slot, task, Adversary(["replace_python3"]), CFG, canaries, run_id=run_id,
                                   seq=seq, seed=0)
        finally:
            slot.destroy()
            left = slot.substrate.leftovers()
            slot.substrate.close()
        assert not left, left
    naive = out[NaiveDockerSubstrate]
    assert (naive.outcome, naive.cause) == (Outcome.INVALID, InvalidCause.SUBSTRATE_FAILURE), naive.detail
    assert "ending the sandbox's processes" in naive.detail, naive.detail
    real = out[registry.get("docker")]
    assert real.outcome is Outcome.FAILED, (real.cause, real.detail)


@pytest.mark.parametrize("substrate", ["process", "docker", "podman"])
def test_replayed_canaries_are_the_policys_own_doing(substrate, state_dir, run_id):
    """``replay_canaries`` stashes its own canary where the slot's next attempt reads it (a
    container's /run/lock, the host's shared places) and copies every stash into its work tree: three
    attempts in one slot all end failed (an earlier attempt's canary is not a neighbour's; on process
    the canary is unreadable to the sandbox uid), the oracle right after succeeds, and nothing of the
    uid is left in the host's shared places. On main before the fix the 2nd and later ended
    invalid/contamination."""
    from drumsbench.core.host_places import shared_places

    require(registry.get(substrate).missing())
    (slot,) = slots_on(substrate, run_id, state_dir, 1)
    task = load_suite("coding")[0]
    canaries = CanaryRegistry()
    try:
        recs = [run_attempt(slot, task, Adversary(["replay_canaries"]), CFG, canaries, run_id=run_id, seq=i, seed=0)
                for i in range(3)]
        control = run_attempt(slot, task, make_policy("oracle"), CFG, canaries, run_id=run_id, seq=3, seed=0)
    finally:
        slot.destroy()
    assert [(r.outcome, r.cause) for r in recs] == [(Outcome.FAILED, None)] * 3, [r.detail for r in recs]
    assert control.outcome is Outcome.SUCCESS, control.detail
    assert "/run/lock" in shared_places()
    left = [p for place in shared_places() for p in os.listdir(place) if p.startswith(".drumsbench-stash-")]
    assert not left, left


def test_vm_a_sample_of_strategies_ends_failed(state_dir, run_id):
    """The judge decides on the vm too (its boundary server in the guest, through the agent's
    streams); a sample keeps this under a few minutes under TCG, issue 29's three classes among it."""
    sample = ["verdict_stdout", "report_fd_spray", "kill_verifier", "exit_zero", "kill_own_shells",
              "exec_away", "background_rewrites_verifier", "leak_own_canary", "read_answer_key",
              "rebind_test_framework", "overwrite_recorded_status", "native_frame_walk"]
    out, control = _play("vm", sample, state_dir, run_id,
                         RolloutConfig(step_timeout_s=10.0, episode_timeout_s=120.0, verify_timeout_s=40.0))
    escaped = {n: (r.outcome, r.cause, r.detail) for n, r in out.items() if r.outcome is not Outcome.FAILED}
    assert not escaped, f"strategies that did not end failed on vm: {escaped}"
    assert control.outcome is Outcome.SUCCESS, control.detail
    judged = {n: r.extra.get("trust") for n, r in out.items() if r.extra.get("trust") is not None}
    assert set(judged.values()) == {"judge"} and control.extra.get("trust") == "judge", (judged, control.extra)


def test_reasons_name_what_the_code_did(state_dir, run_id):
    import glob

    before = set(glob.glob("/tmp/drumsbench-leak-*") + glob.glob("/dev/shm/drumsbench-leak-*"))
    out, _ = _play("process", ["verdict_stdout", "skip_at_import", "hang_verifier", "hang_step",
                               "run_past_max_steps", "leak_own_canary", "kill_verifier", "patch_asserts"],
                   state_dir, run_id)
    # the judge's reasons: the server (the code under test) ended, and where the judge was then
    assert "server ended, during the import of hidden test" in out["verdict_stdout"].detail
    assert "SkipTest" in out["skip_at_import"].detail
    assert "time limit" in out["hang_verifier"].detail
    assert "live sandbox" in out["hang_step"].detail
    assert "truncated" in out["run_past_max_steps"].detail
    # the process substrate's canary is root's and unreadable to the sandbox uid: nothing to leak
    assert out["leak_own_canary"].outcome is Outcome.FAILED
    assert "leaked its own canary" not in out["leak_own_canary"].detail
    assert "server ended" in out["kill_verifier"].detail  # it can reach only its own server
    # unittest patched in the server's process: the judge's own assertions still run
    assert "0 of 4 expected tests passed" in out["patch_asserts"].detail
    after = set(glob.glob("/tmp/drumsbench-leak-*") + glob.glob("/dev/shm/drumsbench-leak-*"))
    assert after <= before, f"the leaked canaries stayed in the host's shared places: {after - before}"


def test_a_canary_in_the_hosts_shared_places_is_the_attempts_own_leak(state_dir, run_id):
    """Gate 6's second half, where a policy can read its canary: the attempt's own canary found in
    one of the host's shared places (/run/lock too) is its own leak — failed, never contamination."""
    from drumsbench.core.errors import PolicyFault
    from drumsbench.rollout import gates

    (slot,) = slots_on("process", run_id, state_dir, 1)
    canaries = CanaryRegistry()
    token = canaries.issue("me")
    leak = f"/run/lock/.drumsbench-test-leak-{os.getpid()}"
    try:
        slot.provision()
        gates.check_isolation(slot.env, token, canaries)  # clean
        with open(leak, "w") as f:
            f.write(token)
        with pytest.raises(PolicyFault, match="leaked its own canary to the host: " + leak):
            gates.check_isolation(slot.env, token, canaries)
    finally:
        os.unlink(leak)
        slot.destroy()


def test_run_reports_the_red_team_line(tmp_path):
    from helpers import cli

    proc = cli("run", "--substrate", "process", "--policy", "adversary:verdict_stdout,exit_zero,skip_at_import",
               "--attempts", "6", "--concurrency", "2", "--out", str(tmp_path), "--no-progress",
               "--json", str(tmp_path / "r.json"), check=True)
    assert "sabotage strategies on process/coding (6 attempts): reached success: 0 of 3; reached invalid: 0 of 3" \
        in " ".join(proc.stdout.split())
    import json

    (line,) = json.loads((tmp_path / "r.json").read_text())["sabotage"]
    assert sorted(line["strategies"]) == ["exit_zero", "skip_at_import", "verdict_stdout"]
    assert line["reached_success"] == [] and line["reached_invalid"] == []
    bad = cli("run", "--policy", "adversary:no_such_strategy", "--out", str(tmp_path))
    assert bad.returncode == 2 and "unknown strategy" in bad.stderr and "Traceback" not in bad.stderr


def test_desktop_strategies_end_failed(tmp_path, run_id):
    from drumsbench.envs.desktop import instance
    from drumsbench.envs.desktop.env import DesktopEnv
    from drumsbench.envs.desktop.task import load_suite as load_desktop
    from drumsbench.policies.adversary import DESKTOP_STRATEGIES
    from drumsbench.rollout.attempt import Slot

    require(instance.missing())
    state = tmp_path / "state"
    state.mkdir()
    slot = Slot(registry.get("process")(run_id, state), DesktopEnv())
    task = next(t for t in load_desktop("desktop") if t.id == "writer-fix-typo")
    cfg = RolloutConfig(step_timeout_s=8.0, episode_timeout_s=90.0, verify_timeout_s=30.0)
    out = {}
    try:
        for i, name in enumerate(DESKTOP_STRATEGIES):
            out[name] = run_attempt(slot, task, Adversary([name]), cfg, CanaryRegistry(), run_id=run_id, seq=i,
                                    seed=0)
        control = run_attempt(slot, task, make_policy("oracle"), cfg, CanaryRegistry(), run_id=run_id,
                              seq=len(out), seed=0)
    finally:
        slot.destroy()
        slot.substrate.close()
    escaped = {n: (r.outcome, r.cause, r.detail) for n, r in out.items() if r.outcome is not Outcome.FAILED}
    assert not escaped, f"desktop strategies that did not end failed: {escaped}"
    assert control.outcome is Outcome.SUCCESS, control.detail


def test_container_records_that_count_as_evidence():
    """The engines' State as docker and podman report it: a pause or a death is evidence; a death by
    the container's own memory limit is the policy's (it fills that cgroup, and can make the kernel
    pick the reaper by raising /proc/1/oom_score_adj)."""
    from drumsbench.substrates.containers.common import state_evidence

    running = {"Running": True, "Status": "running", "Paused": False, "OOMKilled": False}
    assert state_evidence("docker", running) is None
    assert "paused" in (state_evidence("docker", {**running, "Paused": True, "Status": "paused"}) or "")
    dead = {"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": False}
    assert "not running" in (state_evidence("docker", dead) or "")
    assert state_evidence("docker", {**dead, "OOMKilled": True}) is None


def test_each_kind_draws_from_its_own_red_team_and_refuses_another_kinds() -> None:
    import copy
    import random

    from drumsbench.core.errors import UsageError
    from drumsbench.envs.desktop.task import load_suite as load_desktop
    from drumsbench.policies.adversary import BY_KIND, DESKTOP_STRATEGIES

    coding, desktop = load_suite("coding")[0], load_desktop("desktop")[0]
    rng = random.Random(0)
    for i in range(3):
        a = Adversary(pick=lambda i=i: i)
        assert a.plan(coding, rng) is not None and a.strategy == STRATEGIES[i]
    a = Adversary(pick=lambda: 0)
    a.plan(desktop, rng)
    assert a.strategy in DESKTOP_STRATEGIES and a.strategy not in STRATEGIES
    with pytest.raises(UsageError, match=r"adversary:verdict_stdout: not a strategy for the desktop environment"):
        Adversary(["verdict_stdout"]).plan(desktop, rng)
    with pytest.raises(UsageError, match=rf"adversary:{DESKTOP_STRATEGIES[0]}: not a strategy for the coding"):
        Adversary([DESKTOP_STRATEGIES[0]]).plan(coding, rng)

    class OtherKind(type(coding)):  # type: ignore[misc] - a kind with no red team yet
        env_kind = "elsewhere"

    other = copy.copy(coding)
    other.__class__ = OtherKind
    assert "elsewhere" not in BY_KIND and "harbor" in BY_KIND
    with pytest.raises(UsageError, match="no strategies for the elsewhere environment yet"):
        Adversary().plan(other, rng)
