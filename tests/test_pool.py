"""Warm pools (rollout/pool.py) on real substrates: a sandbox dirtied after it was pooled is refused and
replaced, never handed out; the pool refills; closing it leaves nothing; kill -9 of the process that
holds a pool, then `drumsbench gc`, leaves nothing; a run with the pool has the outcomes of one without."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drumsbench.core.fingerprint import tree_digest
from drumsbench.experiments.run import RunConfig, execute
from drumsbench.ledger import Ledger
from drumsbench.measure.cost import DEFAULT_PRICE, AttributionInputs, attribute, pool_use
from drumsbench.measure.windows import usage
from drumsbench.rollout.pool import FRESH, WarmPool, check_fresh, parse_pool, pooled
from drumsbench.substrates import registry
from drumsbench.substrates.base import HostFolders, Sandbox

from conftest import require
from helpers import ROOT, cli

BUILT = ["process", "bwrap", "overlay", "docker", "podman", "vm"]
HOST_CHECKED = {"process", "bwrap", "overlay"}  # a cheap host-side check, repeated at every hand-out


def _substrate(name: str, run_id: str, state_dir: Path):
    cls = registry.get(name)
    require(cls.missing())
    return cls(run_id, state_dir)


def _dirty_from_host(box: Sandbox) -> None:
    """Leave a file in the sandbox's work folder without going through the pool: on the host's side of
    the sandbox's folders where it has them, else by a command the harness runs in it."""
    if isinstance(box, HostFolders):
        (box.host_path(box.paths.work) / "left-behind.txt").write_text("dirt")
    else:
        res = box.exec(f"echo dirt > {box.paths.work}/left-behind.txt", timeout=60)
        assert res.exit_code == 0, res.stderr


def test_the_fresh_fingerprint_is_the_digest_of_four_empty_folders(tmp_path):
    for name in ("work", "home", "tmp", "verify"):
        (tmp_path / name).mkdir()
    assert tree_digest(str(tmp_path)) == FRESH
    (tmp_path / "work" / "x").write_text("x")
    assert tree_digest(str(tmp_path)) != FRESH


def test_pool_option_parses_and_refuses_bad_values():
    assert parse_pool("auto") == "auto" and parse_pool("off") == 0 and parse_pool("3") == 3
    for bad in ("-1", "lots", "513"):
        with pytest.raises(Exception, match="--pool"):
            parse_pool(bad)
    proc = cli("run", "--pool", "lots", "--attempts", "1", "--no-progress", "--out", "/nonexistent-pool-test")
    assert proc.returncode == 2 and "--pool" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", BUILT)
def test_a_sandbox_dirtied_after_pooling_is_refused_and_replaced(name, state_dir, run_id):
    sub = _substrate(name, run_id, state_dir)
    # recheck_s small: where the check is an exec (containers), the background recheck is what sees the dirt;
    # on the vm (TCG) a recheck every 0.5 s raced the test's own exec into the same idle VM
    pool = WarmPool(sub, 2, recheck_s=5.0 if name == "vm" else 0.5)
    handed: list[Sandbox] = []
    try:
        assert pool.wait_full(180), pool.refusals
        dirty = pool.idle_sandboxes()[0]
        _dirty_from_host(dirty)
        assert check_fresh(dirty) is not None  # the check itself sees it (a control for the pool's refusal)
        if name not in HOST_CHECKED:
            # the check is an exec: it is repeated in the background, not at hand-out (docs/pool.md)
            assert pool.wait_for(lambda u: u.refused >= 1, 60), pool.use()
        for _ in range(2):
            box = pool.acquire()
            handed.append(box)
            assert box is not dirty
            assert check_fresh(box) is None
        assert pool.wait_for(lambda u: u.refused >= 1, 60), pool.use()
        assert any(dirty.describe() in r for r in pool.refusals), pool.refusals
        # replaced: the pool fills up to its size again with new sandboxes
        assert pool.wait_full(180), pool.refusals
        again = pool.idle_sandboxes()
        assert dirty not in again and not set(map(id, again)) & set(map(id, handed))
        use = pool.use()
        assert use.created >= 4 and use.hits + use.misses == 2 and use.refused == 1
    finally:
        pool.close()
        for box in handed:
            box.destroy()
        sub.close()
    assert sub.leftovers() == [], sub.leftovers()


@pytest.mark.parametrize("name", BUILT)
def test_refill_and_close_leave_nothing(name, state_dir, run_id):
    sub = _substrate(name, run_id, state_dir)
    p = pooled(sub, 2)
    try:
        assert p.pool.wait_full(180), p.pool.refusals
        first = p.pool.idle_sandboxes()
        box = p.create()  # the substrate's create() is an acquire
        assert box in first and type(box) is type(first[0])
        assert p.pool.wait_full(180), p.pool.refusals  # refilled
        assert p.pool.use().created == 3
        res = box.exec("true", timeout=60)
        assert res.exit_code == 0
        box.destroy()
        assert len(sub.leftovers()) >= 2  # the pooled sandboxes are the substrate's own, labelled with the run
    finally:
        p.close()
    assert sub.leftovers() == [], sub.leftovers()
    use = p.pool.use()
    assert use.closed_destroyed == 2 and use.idle_now == 0


HOLDER = """
import sys, time
from pathlib import Path
from drumsbench.core import host_state as state
from drumsbench.rollout.pool import pooled
from drumsbench.substrates import registry
name, run_id = sys.argv[1], sys.argv[2]
state.register(run_id, [name])
sub = pooled(registry.get(name)(run_id, state.state_dir()), 3)
print("full" if sub.pool.wait_full(300) else "not full", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("name", BUILT)
def test_kill_9_of_a_pool_holder_then_gc_leaves_nothing(name, tmp_path, run_id):
    cls = registry.get(name)
    require(cls.missing())
    state = tmp_path / "state"
    env = {**os.environ, "DRUMSBENCH_STATE": str(state)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name, run_id], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "full", proc.stderr.read() if proc.poll() is not None else line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    sub = cls(run_id, state)
    assert len(sub.leftovers()) >= 3, sub.leftovers()  # the pool's sandboxes outlived their holder
    gc = cli("gc", env={"DRUMSBENCH_STATE": str(state)}, check=True)
    assert "1 dead run" in gc.stdout
    deadline = time.monotonic() + 10
    while sub.leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sub.leftovers() == [], sub.leftovers()


def _outcomes(ledger: Ledger, run_id: str) -> dict[int, tuple[str, str, str | None]]:
    return {r[0]: (r[1], r[2], r[3]) for r in ledger.attempts(run_id, ("seq", "task", "outcome", "cause"))}


@pytest.mark.parametrize("name", ["process", "docker"])
def test_a_run_with_the_pool_has_the_outcomes_of_one_without(name, tmp_path, monkeypatch):
    require(registry.get(name).missing())
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    got = {}
    for pool in (0, 2):
        run_id = f"tpool{pool}-{os.getpid()}"
        # recreate: every attempt takes a new sandbox, so the pooled run hands out many
        cfg = RunConfig.model_validate({"substrate": name, "policy": "noisy", "noisy_p": 0.5, "concurrency": 2,
                                        "duration_s": None, "max_attempts": 10, "seed": 7, "pool": pool,
                                        "rollout": {"reset": "recreate"}})
        ledger.create_run(run_id, "run", cfg.model_dump(mode="json"), {}, "test")
        status, _ = execute(ledger, run_id, cfg, resume=False)
        assert status == "complete"
        got[pool] = _outcomes(ledger, run_id)
        assert registry.get(name)(run_id, tmp_path / "state").leftovers() == []
    assert len(got[0]) == 10 and got[0] == got[2]
    outcomes = {o for _, o, _ in got[2].values()}
    assert outcomes == {"success", "failed"}, got[2]  # both kinds, so "the same" could have differed
    use = pool_use(ledger, "tpool2-" + str(os.getpid()))
    assert use is not None and use.size == 2 and use.hits >= 8 and use.refused == 0 and use.idle_sandbox_s > 0
    assert pool_use(ledger, "tpool0-" + str(os.getpid())) is None
    # the reserve is in the cost per 1,000 verified attempts, from what the pool held
    run2 = "tpool2-" + str(os.getpid())
    with_pool = attribute(DEFAULT_PRICE, AttributionInputs(), usage(ledger, run2), pool=use)
    without = attribute(DEFAULT_PRICE, AttributionInputs(), usage(ledger, run2))
    line = {ln.name: ln for ln in with_pool.lines}["idle reserve"]
    assert "warm pool of 2" in line.detail and f"{use.hits} hits" in line.detail
    assert with_pool.total_usd > without.total_usd


def test_the_run_and_sweep_reports_price_the_pool_they_held(tmp_path):
    """`drumsbench run` and `sweep` with a price file: the idle reserve line of the cost per 1,000 verified
    attempts names the warm pool and what it held (from its `pool` artifacts, not a price-file input)."""
    import json

    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    price = str(ROOT / "examples" / "prices" / "owned-server.toml")
    cli("run", "--attempts", "6", "--concurrency", "2", "--pool", "2", "--price", price, "--out",
        str(tmp_path / "runs"), "--json", str(tmp_path / "run.json"), "--no-progress", env=env, check=True)
    cli("sweep", "--concurrency", "2", "--window", "4s", "--soak", "none", "--stability", "1", "--pool", "2",
        "--price", price, "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "sweep.json"), "--no-progress",
        env=env, check=True)
    run = json.loads((tmp_path / "run.json").read_text())
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    for attribution in (run["costs"]["attribution"], sweep["attribution"]):
        line = {ln["name"]: ln for ln in attribution[0]["lines"]}["idle reserve"]
        assert "warm pool of 2" in line["detail"] and "hits" in line["detail"], line


def _unaccounted_capabilities(forwarded: dict[type, type], not_forwarded: dict[type, str]) -> set[str]:
    """Substrate-level capabilities (typed interfaces of substrates/base.py) some registered
    substrate implements that a pooled substrate neither forwards nor names as not forwarded."""
    from abc import ABC

    from drumsbench.substrates import base, registry

    found = {k for name in registry.names() for k in registry.get(name).__mro__
             if k.__module__ == base.__name__ and issubclass(k, ABC) and k is not base.Substrate}
    return {k.__name__ for k in found if k not in forwarded and k not in not_forwarded}


def test_a_pooled_substrate_keeps_the_capabilities_of_its_inner_one():
    """Every substrate-level capability of a registered substrate is forwarded by its pooled class
    (which then has it exactly when the inner class has) or named, with why, as not forwarded.
    Positive control: with ImageFlavors' reason taken out, the check names it."""
    from drumsbench.rollout.pool import FORWARDED, NOT_FORWARDED, pooled_class
    from drumsbench.substrates import registry

    assert not _unaccounted_capabilities(FORWARDED, NOT_FORWARDED)
    for name in registry.names():
        cls = registry.get(name)
        made = pooled_class(cls)
        assert made.name == cls.name and made.sandbox_class is cls.sandbox_class
        for cap in FORWARDED:
            assert issubclass(made, cap) == issubclass(cls, cap), (name, cap.__name__)
    overlay = pooled_class(registry.get("overlay"))
    assert {c.__name__ for c in FORWARDED if issubclass(overlay, c)} == {"Forking", "PortableSnapshots", "RecipeImages"}
    fewer = {k: v for k, v in NOT_FORWARDED.items() if k.__name__ != "ImageFlavors"}
    assert _unaccounted_capabilities(FORWARDED, fewer) == {"ImageFlavors"}
