"""``drumsbench train --executor ray``: the training experiment's attempts on a real 2-node Ray
cluster on loopback (every process carries ``ray_env``'s loopback settings).

A few steps of two treatments with faults at 10x the correlated rates: every attempt ran on a node
of the cluster, both nodes were used, and attempt by attempt the outcome, the cause of an invalid
attempt and the actions are those of the same experiment in process (the draws depend on the
seed and the attempt's key alone), so the valid flag and cause come back as they are today.
"""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")

from test_ray import loopback_cluster  # noqa: E402

from drumsbench.ledger import Ledger  # noqa: E402
from drumsbench.substrates.process import ProcessSubstrate  # noqa: E402
from drumsbench.train.experiment import TrainConfig, run_train  # noqa: E402
from drumsbench.train.fault_model import FaultMode  # noqa: E402
from drumsbench.train.rebuild import build_report  # noqa: E402
from drumsbench.train.treatments import Treatment  # noqa: E402

from helpers import cli  # noqa: E402

FAULTY = ["invoice-rounding-mode", "textstats-truncate-width"]


@pytest.fixture(autouse=True)
def _torch_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-cache"))


def _train(cfg: TrainConfig, tmp_path, run_id: str) -> Ledger:
    ledger = Ledger(tmp_path / f"{run_id}.sqlite")
    ledger.create_run(run_id, "train", cfg.model_dump(mode="json"), {"hostname": "test"}, "test")
    state = tmp_path / f"state-{run_id}"
    state.mkdir()
    sub = ProcessSubstrate(run_id, state)
    try:
        run_train(cfg, sub, ledger, run_id)
    finally:
        sub.close()
    assert not any((state / "sandboxes").glob("*/*")), "sandboxes left behind"
    return ledger


def _table(ledger: Ledger, run_id: str) -> dict[tuple, tuple]:
    cols = ("task", "outcome", "cause", "reward", "injected", "executor", "extra")
    out = {}
    for row in ledger.attempts(run_id, cols):
        r = dict(zip(cols, row, strict=True))
        extra = json.loads(r["extra"])
        t = extra["train"]
        key = (t["treatment"], t["phase"], t["iteration"], t["group"], t["member"], t["retry"])
        out[key] = (r["task"], r["outcome"], r["cause"], r["reward"], r["injected"], tuple(extra["actions"]),
                    r["executor"], extra.get("node"))
    return out


def test_train_on_ray_carries_valid_and_cause_as_in_process(tmp_path):
    cfg = TrainConfig(treatments=[Treatment.EXCLUDE, Treatment.ZERO], seeds=[2], fault_mode=FaultMode.CORRELATED,
                      fault_scale=10.0, only=FAULTY, holdout_every=0, iterations=1, groups=2, group_size=2,
                      eval_every=1, eval_episodes=1, final_eval_episodes=1, concurrency=1)
    local = _table(_train(cfg, tmp_path, "tlocal"), "tlocal")
    with loopback_cluster(1):
        ledger = _train(cfg.model_copy(update={"executor": "ray"}), tmp_path, "tray")
    on_ray = _table(ledger, "tray")
    assert on_ray.keys() == local.keys() and len(on_ray) == 16
    assert {v[6] for v in on_ray.values()} == {"ray"} and {v[6] for v in local.values()} == {"local"}
    assert len({v[7] for v in on_ray.values()}) == 2, "the attempts ran on one node only"
    for key, got in on_ray.items():
        assert got[:6] == local[key][:6], key
    invalid = [v for v in on_ray.values() if v[1] == "invalid"]
    assert invalid and all(v[2] and v[3] is None for v in invalid), "no invalid attempt: the check proves nothing"
    report = build_report(ledger, "tray")
    assert report.isolation_control_fired
    cost = {c.treatment: c for c in report.costs}
    assert cost["exclude"].invalid_in_loss == 0 < cost["zero"].invalid_in_loss


def test_a_node_lost_mid_attempt_is_invalid_and_training_goes_on(tmp_path):
    """``node_3`` is lost while one of its attempts runs (a sandbox command of the run under it): its
    workers, everything else under its raylet, then the raylet are SIGKILLed at once (a machine
    lost); each of its in-flight attempts is recorded once, invalid/substrate_failure with
    ``lost_node`` and no decisions; the batch finishes on the other nodes and the run completes with
    every planned attempt recorded."""
    import threading
    from pathlib import Path

    from test_ray import _descendants, lose_node
    from test_ray_desktop import HEALTH

    from drumsbench.substrates.process import RUN_VAR

    cfg = TrainConfig(treatments=[Treatment.EXCLUDE], seeds=[3], fault_scale=0.0, only=FAULTY, holdout_every=0,
                      iterations=1, groups=2, group_size=3, eval_every=1, eval_episodes=1, final_eval_episodes=1,
                      concurrency=1, executor="ray")
    with loopback_cluster(2, HEALTH) as (c, _env, extra):
        node3 = extra[1]
        raylet = node3.all_processes["raylet"][0].process.pid
        label = f"{RUN_VAR}=tlost".encode()
        stop = threading.Event()
        killed: list[float] = []
        what: list[bytes] = []

        def command_of_the_run(pid: int) -> bool:
            """A sandbox command of the run: labelled, and neither the sandbox's spawner nor its kept
            verifier server (``-S -c``, ``--serve``), which live between attempts too."""
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            return (label in Path(f"/proc/{pid}/environ").read_bytes() and b"\0--serve\0" not in cmdline
                    and b"\0-S\0-c\0" not in cmdline)

        def kill_node3_mid_attempt() -> None:
            while not stop.is_set():
                for pid in _descendants(raylet) - {raylet}:
                    try:
                        if command_of_the_run(pid):
                            seen = Path(f"/proc/{pid}/cmdline").read_bytes()[:200]
                            # the machine is lost at once, everything on it (this attempt is fast)
                            lose_node(c, node3, everything=True)
                            killed.append(time.time())
                            what.append(seen)
                            return
                    except OSError:
                        continue
                stop.wait(0.005)

        killer = threading.Thread(target=kill_node3_mid_attempt, daemon=True)
        killer.start()
        try:
            ledger = _train(cfg, tmp_path, "tlost")
        finally:
            stop.set()
            killer.join(30)
            if not killed:
                c.remove_node(node3)
    assert killed, "node_3 never ran an attempt"
    cols = ("seq", "outcome", "cause", "reward", "extra", "detail")
    recs = [dict(zip(cols, row, strict=True)) for row in ledger.attempts("tlost", cols)]
    seqs = [r["seq"] for r in recs]
    assert len(seqs) == len(set(seqs)), "an attempt was recorded twice"
    lost = [r for r in recs if json.loads(r["extra"]).get("lost_node")]
    assert lost, (what, [(r["seq"], r["outcome"], r["detail"]) for r in recs])
    for r in lost:
        extra = json.loads(r["extra"])
        assert extra["node"] == node3.node_id and not extra.get("actions"), extra
        assert (r["outcome"], r["cause"], r["reward"]) == ("invalid", "substrate_failure", None)
        assert "lost mid-attempt" in r["detail"]
    assert all(r["cause"] is None for r in recs if r not in lost), "an invalid attempt besides the lost node's"
    # every planned attempt is there: 1 iteration x 2 groups x 3 members, plus the evaluations
    report = build_report(ledger, "tlost")
    assert report.isolation_control_fired
    assert sum(1 for r in recs if json.loads(r["extra"])["train"]["phase"] == "train") == 6
    after = [json.loads(r["extra"]).get("node") for r in recs if r["seq"] > max(x["seq"] for x in lost)]
    assert after and node3.node_id not in after, "the lost node was used again"


@pytest.mark.parametrize(("args", "flag"), [
    (["--executor", "spark"], "--executor"),  # the other --executor/--ray-address errors: tests/test_ray.py
    (["--executor", "ray", "--start", "fork"], "--start"),
])
def test_train_bad_executor_input_is_one_line(args, flag, tmp_path):
    proc = cli("train", *args, "--out", str(tmp_path / "runs"), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in proc.stderr
