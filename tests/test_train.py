"""drumsbench train: a real GRPO-style loop on the real coding environment and process substrate.

- the trainer improves a toy task from the built-in suite within a small budget (fixed seed);
- ``exclude`` never lets an invalid attempt reach the loss (on the ledger and on the batch), while
  ``zero`` does (so the check can fail);
- the treatments see the same fault draws for the same seed;
- the report is rebuilt from the ledger alone; the CLI's bad input is one line, exit 2.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from drumsbench.ledger import Ledger  # noqa: E402
from drumsbench.substrates.process import ProcessSubstrate  # noqa: E402
from drumsbench.train.action_space import GOLDEN_SLOT, N_ACTIONS, SLOTS, ActionSpace  # noqa: E402
from drumsbench.train.artifact import TrainReport  # noqa: E402
from drumsbench.train.experiment import TrainConfig, run_train  # noqa: E402
from drumsbench.train.fault_model import FaultMode, FaultModel  # noqa: E402
from drumsbench.train.grpo import Sample, update  # noqa: E402
from drumsbench.train.policy_net import Decision, Snapshot, features, make_net  # noqa: E402
from drumsbench.train.rebuild import build_report, sign_flip_p  # noqa: E402
from drumsbench.train.treatments import Treatment, group_advantages  # noqa: E402

from helpers import cli  # noqa: E402

TOY = ["textstats-empty-summary", "textstats-sentence-tail", "textstats-stopwords-case"]
FAULTY = ["invoice-rounding-mode", "textstats-truncate-width"]


@pytest.fixture(autouse=True)
def _torch_cache(monkeypatch, tmp_path):
    """torch's optimizer would leave an empty cache folder in the host's /tmp."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-cache"))


def _train(cfg: TrainConfig, tmp_path, state_dir, run_id: str) -> Ledger:
    ledger = Ledger(tmp_path / f"{run_id}.sqlite")
    ledger.create_run(run_id, "train", cfg.model_dump(mode="json"), {"hostname": "test"}, "test")
    sub = ProcessSubstrate(run_id, state_dir)
    try:
        run_train(cfg, sub, ledger, run_id)
    finally:
        sub.close()
    ledger.set_status(run_id, "complete")
    return ledger


def _rows(ledger: Ledger, run_id: str) -> list[dict]:
    cols = ("seq", "task", "outcome", "cause", "reward", "injected", "extra")
    out = []
    for row in ledger.attempts(run_id, cols):
        rec = dict(zip(cols, row, strict=True))
        rec["extra"] = json.loads(rec["extra"])
        out.append(rec)
    return out


# -- pure rules ---------------------------------------------------------------------------------

def test_group_advantages_per_treatment():
    rewards = [1.0, 0.0, None, 1.0]
    ex = group_advantages(rewards, Treatment.EXCLUDE)
    assert ex[2] is None  # no gradient
    # statistics over the three valid members: mean 2/3, std sqrt(2)/3
    assert ex[0] == pytest.approx((1 - 2 / 3) / (2 ** 0.5 / 3), rel=1e-4)
    assert ex[1] == pytest.approx((0 - 2 / 3) / (2 ** 0.5 / 3), rel=1e-4)
    assert group_advantages(rewards, Treatment.RETRY) == ex
    zero = group_advantages(rewards, Treatment.ZERO)
    assert zero[2] == pytest.approx(-1.0, rel=1e-4) and zero[0] == pytest.approx(1.0, rel=1e-4)
    mask = group_advantages(rewards, Treatment.MASK)
    assert mask[2] is None  # out of the loss, but its 0 moved the siblings' statistics:
    assert mask[0] == pytest.approx(zero[0]) and mask[0] != pytest.approx(ex[0])
    assert group_advantages([1.0, 1.0, None], Treatment.EXCLUDE) == [0.0, 0.0, None]
    assert group_advantages([None, None], Treatment.EXCLUDE) == [None, None]


def test_update_leaves_out_samples_without_advantage():
    """On the batch itself: a member with advantage None changes nothing in the update."""
    x = features([], None, 0, 3).tolist()

    def fresh():
        net = make_net(3, seed=7)
        return net, torch.optim.Adam(net.parameters(), lr=0.1)

    golden = Sample(1, [Decision(x, GOLDEN_SLOT, -2.2)], 1.0)
    invalid = Sample(2, [Decision(x, 0, -2.2)], None)
    net_a, opt_a = fresh()
    stats = update(net_a, opt_a, [golden, invalid])
    assert stats.in_loss == [1] and stats.out_of_loss == [2] and stats.decisions == 1
    net_b, opt_b = fresh()
    update(net_b, opt_b, [golden])
    for pa, pb in zip(net_a.parameters(), net_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    net_c, opt_c = fresh()
    before = [p.detach().clone() for p in net_c.parameters()]
    assert update(net_c, opt_c, [invalid]).in_loss == []
    assert all(torch.equal(a, b) for a, b in zip(before, net_c.parameters(), strict=True))
    assert Snapshot.of(net_a, 3).start_probs()[GOLDEN_SLOT] > Snapshot.of(net_c, 3).start_probs()[GOLDEN_SLOT]


def test_fault_draws_do_not_depend_on_the_treatment_and_follow_the_action():
    a, b = FaultModel(mode=FaultMode.CORRELATED, seed=4), FaultModel(mode=FaultMode.CORRELATED, seed=5)
    keys = [(it, g, m, r) for it in range(3) for g in range(3) for m in range(4) for r in range(2)]
    assert len({a.step_draw(k, 0) for k in keys}) == len(keys)
    assert [a.step_draw(k, 1) for k in keys] != [b.step_draw(k, 1) for k in keys]
    assert a.step_rate(SLOTS.index("test")) > a.step_rate(SLOTS.index("read")) > 0
    assert a.verifier_rate("invoice-rounding-mode") > a.verifier_rate("textstats-sentence-tail") == 0
    u = FaultModel(mode=FaultMode.UNIFORM)
    assert len({u.step_rate(i) for i in range(N_ACTIONS - 1)}) == 1
    assert FaultModel(mode=FaultMode.NONE).step_rate(GOLDEN_SLOT) == 0
    assert sign_flip_p([0.2, 0.2, 0.2, 0.2, 0.2]) == pytest.approx(2 / 32)


def test_action_space_from_a_real_task():
    from drumsbench.envs import suites

    task = next(t for t in suites.load("coding").tasks if t.id == TOY[0])
    space = ActionSpace.of(task)
    assert len(space.specs) == N_ACTIONS and space.specs[GOLDEN_SLOT].payload["patch"] == task.golden_patch
    assert space.specs[SLOTS.index("wrong1")].payload["patch"] == task.wrong_patches[0]
    adv = [s for name, s in zip(SLOTS, space.specs, strict=True) if name.startswith("adv_")]
    assert adv and all("DRUMSBENCH_ADVERSARY" in s.payload["command"] for s in adv)


# -- real training -------------------------------------------------------------------------------

def test_trainer_improves_a_toy_task(tmp_path, state_dir, run_id):
    """A real learning test: from the initial (near-random) policy to high success, fixed seed."""
    cfg = TrainConfig(treatments=[Treatment.EXCLUDE], seeds=[12], fault_mode=FaultMode.NONE, only=TOY,
                      holdout_every=0, iterations=7, groups=3, group_size=4, eval_every=7, eval_episodes=3,
                      final_eval_episodes=4, concurrency=2)
    ledger = _train(cfg, tmp_path, state_dir, run_id)
    report = build_report(ledger, run_id)
    points = report.curves[0].points
    assert [p.iteration for p in points] == [0, 7]
    start, end = points[0], points[-1]
    assert start.success.value is not None and end.success.value is not None
    assert start.success.value <= 0.5, start
    assert end.success.value >= 0.8, end
    assert end.success.value - start.success.value >= 0.5
    assert start.mass_golden < 0.25 < 0.8 < end.mass_golden
    assert end.mass_sabotage < start.mass_sabotage


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """All four treatments, same seed, faults at 4x the correlated rates (so they surely fire)."""
    tmp = tmp_path_factory.mktemp("train-faulty")
    state = tmp / "state"
    state.mkdir()
    cfg = TrainConfig(treatments=list(Treatment), seeds=[2], fault_mode=FaultMode.CORRELATED, fault_scale=4.0,
                      only=FAULTY, holdout_every=0, iterations=2, groups=2, group_size=3, eval_every=2,
                      eval_episodes=1, final_eval_episodes=1, concurrency=2)
    ledger = _train(cfg, tmp, state, "tfaulty")
    return ledger, "tfaulty"


def test_treatments_see_the_same_fault_draws(faulty):
    ledger, rid = faulty
    first: dict[str, dict[tuple[int, int], tuple]] = defaultdict(dict)
    for r in _rows(ledger, rid):
        t = r["extra"]["train"]
        if t["phase"] == "train" and t["iteration"] == 0 and t["retry"] == 0:
            first[t["treatment"]][(t["group"], t["member"])] = (
                r["task"], tuple(r["extra"]["actions"]), json.dumps(r["extra"]["step_fault"]), r["injected"],
                r["outcome"], r["cause"])
    assert set(first) == {t.value for t in Treatment}
    reference = first["exclude"]
    assert len(reference) == 6
    for treatment, seen in first.items():
        assert seen == reference, treatment
    faults = [v for v in reference.values() if v[5] is not None]
    assert faults, "no fault fired in iteration 0: the comparison would prove nothing"


def test_exclude_keeps_invalid_out_of_the_loss(faulty):
    ledger, rid = faulty
    rows = {r["seq"]: r for r in _rows(ledger, rid)}
    batches = ledger.artifacts(rid, "train-batch")
    in_loss: dict[str, set[int]] = defaultdict(set)
    for b in batches.values():
        in_loss[b["treatment"]].update(b["in_loss"])
        for seq in b["in_loss"]:
            assert rows[seq]["extra"]["train"]["treatment"] == b["treatment"]
    invalid = defaultdict(set)
    for seq, r in rows.items():
        t = r["extra"]["train"]
        if t["phase"] == "train" and r["outcome"] == "invalid":
            assert r["reward"] is None  # never 0 in the ledger, whatever the treatment
            invalid[t["treatment"]].add(seq)
    assert invalid["exclude"], "no invalid attempt in exclude: the check would prove nothing"
    assert not invalid["exclude"] & in_loss["exclude"]
    assert not invalid["mask"] & in_loss["mask"]
    assert invalid["zero"] & in_loss["zero"], "zero must train on its invalid attempts"
    report = build_report(ledger, rid)
    cost = {c.treatment: c for c in report.costs}
    assert cost["exclude"].invalid_in_loss == 0 == cost["mask"].invalid_in_loss == cost["retry"].invalid_in_loss
    assert cost["zero"].invalid_in_loss == len(invalid["zero"] & in_loss["zero"]) > 0
    assert cost["retry"].retries > 0 and cost["retry"].attempts > cost["exclude"].attempts


def test_report_is_rebuilt_from_the_ledger(faulty, tmp_path):
    ledger, rid = faulty
    a = build_report(ledger, rid).model_dump(mode="json", by_alias=True)
    again = Ledger(ledger.path)  # a fresh reader of the same file
    b = build_report(again, rid).model_dump(mode="json", by_alias=True)
    assert a == b
    report = TrainReport.model_validate(a)
    assert report.schema_ == "drumsbench.train-report/1"
    assert [f.treatment for f in report.finals] == [t.value for t in Treatment]
    assert {(c.a, c.b) for c in report.comparisons} == {("exclude", t) for t in ("zero", "mask", "retry")}
    assert report.isolation_control_fired


# -- the command -------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "flag"), [
    (["--treatments", "exclude,bogus"], "--treatments"),
    (["--seeds", "0"], "--seeds"),
    (["--faults", "sometimes"], "--faults"),
    (["--groups", "0"], "--groups"),
    (["--group-size", "1"], "--group-size"),
    (["--task-ids", "no-such-task"], "--task-ids"),
    (["--step-timeout", "soon"], "--step-timeout"),
])
def test_bad_input_is_one_line_naming_the_flag(args, flag, tmp_path):
    proc = cli("train", *args, "--out", str(tmp_path / "runs"), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in proc.stderr


def test_cli_trains_writes_json_and_rebuilds(tmp_path):
    out, js = tmp_path / "runs", tmp_path / "train.json"
    proc = cli("train", "--treatments", "exclude,zero", "--seeds", "1", "--iterations", "1", "--groups", "1",
               "--group-size", "2", "--task-ids", TOY[0], "--holdout-every", "0", "--eval-episodes", "1",
               "--final-eval-episodes", "1", "--concurrency", "2", "--out", str(out), "--json", str(js),
               "--no-progress", check=True)
    assert "final eval" in proc.stdout and "exclude - zero" in proc.stdout
    report = TrainReport.model_validate_json(js.read_text())
    assert report.costs[0].attempts == 2 and report.finals[0].valid + report.finals[1].valid >= 1
    again = cli("train", "--report", report.run_id, "--out", str(out), "--json", str(tmp_path / "again.json"),
                check=True)
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(js.read_text())
    assert "final eval" in again.stdout


def test_integrity_off_lets_sabotage_reach_reward_one(state_dir, run_id):
    """The integrity contrast's environment: a forgeable verdict pays the adversary actions; the honest
    verifier fails them. The golden patch succeeds on both; a damaged naive runner is still invalid."""
    from drumsbench.core.outcome import InvalidCause
    from drumsbench.envs import suites
    from drumsbench.envs.base import SUBMIT, ActionSpec
    from drumsbench.envs.coding.env import CodingEnv
    from drumsbench.policies.scripted import Policy
    from drumsbench.rollout.attempt import RolloutConfig, Slot, run_attempt
    from drumsbench.rollout.isolation import CanaryRegistry
    from drumsbench.train.integrity import ForgeableCodingEnv

    class Plan(Policy):
        name = "plan"

        def __init__(self, spec: ActionSpec) -> None:
            super().__init__()
            self.spec = spec

        def plan(self, task, rng):
            return [self.spec, ActionSpec(SUBMIT)]

    task = next(t for t in suites.load("coding").tasks if t.id == TOY[1])
    space = ActionSpace.of(task)
    cfg = RolloutConfig(step_timeout_s=10, episode_timeout_s=60)
    sub = ProcessSubstrate(run_id, state_dir)
    canaries = CanaryRegistry()
    seen: dict[tuple[str, str], str] = {}
    try:
        for env in (ForgeableCodingEnv(), CodingEnv()):
            slot = Slot(sub, env)
            for name in ("golden", "adv_verdict_stdout", "adv_skip_every_test"):
                rec = run_attempt(slot, task, Plan(space.specs[SLOTS.index(name)]), cfg, canaries, run_id=run_id,
                                  seq=len(seen), seed=0)
                seen[(type(env).__name__, name)] = rec.outcome.value
            if isinstance(env, ForgeableCodingEnv):
                rec = run_attempt(slot, task, Plan(space.specs[GOLDEN_SLOT]), cfg, canaries, run_id=run_id,
                                  seq=99, seed=0, fault=InvalidCause.VERIFIER_UNAVAILABLE)
                assert rec.cause is InvalidCause.VERIFIER_UNAVAILABLE
            slot.destroy()
    finally:
        sub.close()
    forge, honest = "ForgeableCodingEnv", "CodingEnv"
    assert seen == {(forge, "golden"): "success", (forge, "adv_verdict_stdout"): "success",
                    (forge, "adv_skip_every_test"): "success", (honest, "golden"): "success",
                    (honest, "adv_verdict_stdout"): "failed", (honest, "adv_skip_every_test"): "failed"}
    arms = TrainConfig(treatments=[Treatment.EXCLUDE], integrity=["on", "off"]).arms()
    assert [a.label for a in arms] == ["exclude", "exclude+integrity-off"]


def test_fork_and_scratch_arms_see_the_same_episodes(tmp_path, state_dir, run_id):
    """Group members forked from one prepared parent (file-copy fork, gate 1 checks faithfulness) take
    the same actions, meet the same faults and end the same as members run from scratch."""
    cfg = TrainConfig(treatments=[Treatment.EXCLUDE], start=["scratch", "fork"], prefix_k=2, seeds=[5],
                      fault_mode=FaultMode.CORRELATED, fault_scale=3.0, only=FAULTY, holdout_every=0, iterations=1,
                      groups=2, group_size=3, eval_every=1, eval_episodes=1, final_eval_episodes=1, concurrency=2)
    ledger = _train(cfg, tmp_path, state_dir, run_id)
    seen: dict[str, dict[tuple[int, int], tuple]] = defaultdict(dict)
    forked = 0
    for r in _rows(ledger, run_id):
        t = r["extra"]["train"]
        if t["phase"] == "train":
            seen[t["treatment"]][(t["group"], t["member"])] = (r["task"], tuple(r["extra"]["actions"]), r["outcome"],
                                                              r["cause"])
            forked += "fork" in r["extra"]
            if "fork" in r["extra"]:
                fork = r["extra"]["fork"]
                assert t["start"] == "fork" and fork["method"] == "file"
                assert fork["creation_s"] == fork["handover_s"]  # a file copy is made while the caller waits
    assert forked == 6 and len(seen["exclude"]) == 6
    assert seen["exclude+fork"] == seen["exclude"]
    assert all(v[1][:2] == ("read", "test") for v in seen["exclude"].values())
    assert all(v[3] != "dirty_reset" for v in seen["exclude+fork"].values())  # every fork was faithful
