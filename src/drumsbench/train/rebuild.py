"""The train report rebuilt from the ledger alone: attempts (with ``extra.train``), the batch and
policy artifacts, the segments (host time), the isolation control and the run's configuration.

Statistics: eval success per (treatment, seed, eval point) = successes / valid eval attempts;
across seeds, the mean with a t interval (Wilson over the pooled attempts for one seed). The
difference of two treatments is paired by seed (same seeds, same fault draws): paired t interval,
exact sign-flip permutation test over the seeds, and Fisher's exact test on the pooled final eval
attempts.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from typing import Any

from drumsbench.ledger import Ledger
from drumsbench.measure.cost import HostPrice
from drumsbench.measure.stats import CONFIDENCE, Estimate, wilson
from drumsbench.train.artifact import Comparison, Curve, CurvePoint, FinalEval, TrainReport, TreatmentCost
from drumsbench.train.treatments import Treatment


def t_interval(values: list[float]) -> Estimate:
    """Mean of ``values`` with a two-sided t interval (none for fewer than two values)."""
    n = len(values)
    if n == 0:
        return Estimate(value=None, low=None, high=None, n=0, method="t over seeds")
    mean = sum(values) / n
    if n == 1:
        return Estimate(value=mean, low=None, high=None, n=1, method="t over seeds (one seed: no interval)")
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n)
    return Estimate(value=mean, low=mean - half, high=mean + half, n=n, method="t over seeds")


def _clip01(e: Estimate) -> Estimate:
    if e.value is None or e.low is None or e.high is None:
        return e
    return e.model_copy(update={"low": max(0.0, e.low), "high": min(1.0, e.high)})


def sign_flip_p(diffs: list[float]) -> float | None:
    """Exact two-sided paired permutation test: share of sign flips whose |mean| >= the observed."""
    if not diffs:
        return None
    observed = abs(sum(diffs))
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(diffs)):
        total += 1
        hits += abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed - 1e-12
    return hits / total


def fisher_p(a_success: int, a_n: int, b_success: int, b_n: int) -> float | None:
    if a_n == 0 or b_n == 0:
        return None
    from scipy import stats

    return float(stats.fisher_exact([[a_success, a_n - a_success], [b_success, b_n - b_success]])[1])


def _times(e: Estimate, factor: float) -> Estimate:
    """``e`` times a positive constant; a missing bound stays missing."""
    return e.model_copy(update={k: None if getattr(e, k) is None else getattr(e, k) * factor
                                for k in ("value", "low", "high")})


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in rows) / len(rows) if rows else 0.0


def _attempts(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    cols = ("seq", "task", "outcome", "cause", "reward", "injected", "extra", "t_start", "t_end", "window")
    out = []
    for row in ledger.attempts(run_id, cols):
        rec = dict(zip(cols, row, strict=True))
        rec["extra"] = json.loads(rec["extra"])
        rec["train"] = rec["extra"].get("train", {})
        out.append(rec)
    return out


def build_report(ledger: Ledger, run_id: str) -> TrainReport:
    from drumsbench.train.experiment import TrainConfig

    run = ledger.run(run_id)
    config = TrainConfig.model_validate(run["config"])
    cfg = config.model_dump(mode="json")
    treatments: list[str] = [arm.label for arm in config.arms()]
    seeds: list[int] = list(cfg["seeds"])
    price = HostPrice.model_validate(cfg["price"])
    attempts = _attempts(ledger, run_id)
    split = ledger.artifacts(run_id, "train-split").get("tasks", {"train": [], "eval": []})
    policies = ledger.artifacts(run_id, "train-policy")
    batches = ledger.artifacts(run_id, "train-batch")

    # eval[(treatment, seed, iteration)] -> (successes, valid)
    ev: dict[tuple[str, int, int], list[int]] = defaultdict(lambda: [0, 0])
    ev_start: dict[tuple[str, int, int], float] = {}
    train_attempts: dict[tuple[str, int, int], int] = Counter()
    for a in attempts:
        t = a["train"]
        if not t:
            continue
        if t["phase"] == "eval":
            k = (t["treatment"], t["seed"], t["iteration"])
            ev_start[k] = min(ev_start.get(k, a["t_start"]), a["t_start"])
            cell = ev[k]
            if a["outcome"] != "invalid":
                cell[1] += 1
                cell[0] += a["outcome"] == "success"
        else:
            train_attempts[(t["treatment"], t["seed"], t["iteration"])] += 1
    iterations = sorted({k[2] for k in ev})

    def rate(tr: str, seed: int, it: int) -> float | None:
        s, n = ev.get((tr, seed, it), [0, 0])
        return s / n if n else None

    curves = []
    for tr in treatments:
        points = []
        for it in iterations:
            per_seed = [rate(tr, s, it) for s in seeds]
            values = [v for v in per_seed if v is not None]
            masses: list[dict[str, Any]] = [m for s in seeds if (m := policies.get(f"{tr}/s{s}/i{it}"))]
            done = [sum(train_attempts[(tr, s, i)] for i in range(it)) for s in seeds]
            points.append(CurvePoint(iteration=it, train_attempts=sum(done) / len(done),
                                     success=_clip01(t_interval(values)), per_seed=per_seed,
                                     mass_golden=_mean(masses, "mass_golden"),
                                     mass_sabotage=_mean(masses, "mass_sabotage"),
                                     mass_test=_mean(masses, "mass_test")))
        curves.append(Curve(treatment=tr, points=points))

    last = iterations[-1] if iterations else 0
    finals = []
    for tr in treatments:
        per_seed = [rate(tr, s, last) for s in seeds]
        succ = sum(ev.get((tr, s, last), [0, 0])[0] for s in seeds)
        valid = sum(ev.get((tr, s, last), [0, 0])[1] for s in seeds)
        finals.append(FinalEval(treatment=tr, success=_clip01(t_interval([v for v in per_seed if v is not None])),
                                pooled=wilson(succ, valid), per_seed=per_seed, successes=succ, valid=valid))

    comparisons = []
    base = Treatment.EXCLUDE.value if Treatment.EXCLUDE.value in treatments else treatments[0]
    fa = next(f for f in finals if f.treatment == base)
    for fb in finals:
        if fb.treatment == base:
            continue
        diffs = [x - y for x, y in zip(fa.per_seed, fb.per_seed, strict=True) if x is not None and y is not None]
        diff = t_interval(diffs)
        p_perm = sign_flip_p(diffs)
        p_f = fisher_p(fa.successes, fa.valid, fb.successes, fb.valid)
        note = (f"{len(diffs)} paired seeds; the smallest p a sign-flip test can give with them is "
                f"{2 / 2 ** len(diffs):.3g}" if diffs else "no paired seeds")
        comparisons.append(Comparison(a=base, b=fb.treatment, difference=diff, p_paired_permutation=p_perm,
                                      p_fisher=p_f, note=note))

    seg_s: dict[str, float] = defaultdict(float)
    seg_start: dict[str, float] = {}
    for started, ended, label in ledger.segments(run_id):
        seg_s[label.split("/")[0]] += ended - started
        seg_start.setdefault(label, started)
    in_loss_seqs: dict[str, set[int]] = defaultdict(set)
    retries: Counter[str] = Counter()
    for b in batches.values():
        in_loss_seqs[b["treatment"]].update(b["in_loss"])
        retries[b["treatment"]] += b.get("retries", 0)
    costs = []
    for tr in treatments:
        rows = [a for a in attempts if a["train"].get("treatment") == tr and a["train"].get("phase") == "train"]
        invalid = Counter(a["cause"] for a in rows if a["outcome"] == "invalid")
        valid = sum(a["outcome"] != "invalid" for a in rows)
        bad = sum(1 for a in rows if a["outcome"] == "invalid" and a["seq"] in in_loss_seqs[tr])
        host = seg_s.get(tr, 0.0)
        to_90 = []
        for sd in seeds:
            hit = next((it for it in iterations if (rate(tr, sd, it) or 0.0) >= 0.9), None)
            if hit is not None and f"{tr}/s{sd}" in seg_start and (tr, sd, hit) in ev_start:
                to_90.append(ev_start[(tr, sd, hit)] - seg_start[f"{tr}/s{sd}"])
        h90 = t_interval(to_90) if to_90 else None
        costs.append(TreatmentCost(
            reached_90=len(to_90), host_s_to_90=h90,
            usd_to_90=None if h90 is None else _times(h90, price.usd_per_host_hour / 3600),
            treatment=tr, attempts=len(rows), valid=valid, success=sum(a["outcome"] == "success" for a in rows),
            invalid=dict(invalid), invalid_rate=wilson(sum(invalid.values()), len(rows)), retries=retries[tr],
            invalid_in_loss=bad, host_s=host, s_per_valid_rollout=host / valid if valid else None,
            usd_per_valid_rollout=(host / 3600 * price.usd_per_host_hour / valid) if valid else None))

    fired = all(c["fired"] for c in ledger.controls(run_id)) and bool(ledger.controls(run_id))
    from drumsbench.train.fault_model import FaultMode, FaultModel

    recorded = ledger.artifacts(run_id, "train-faults").get("model", {})
    described = recorded.get("describe") or FaultModel(mode=FaultMode(cfg["fault_mode"])).describe()
    return TrainReport(
        run_id=run_id, substrate=cfg["substrate"], suite=cfg["tasks"], train_tasks=split["train"],
        eval_tasks=split["eval"], treatments=treatments, seeds=seeds, fault_mode=cfg["fault_mode"],
        faults=described, iterations=cfg["iterations"], groups=cfg["groups"], group_size=cfg["group_size"],
        curves=curves, finals=finals, comparisons=comparisons, costs=costs, isolation_control_fired=fired,
        price=price, config=cfg,
        conditions=(f"{cfg['substrate']} substrate, suite {cfg['tasks']}, {len(seeds)} seeds, {cfg['iterations']} "
                    f"iterations x {cfg['groups']} groups x {cfg['group_size']} attempts; eval on "
                    f"{len(split['eval'])} tasks x {cfg['eval_episodes']} sampled episodes "
                    f"({cfg['final_eval_episodes']} at the end), no faults; "
                    f"machine {run['machine'].get('hostname', '?')}, commit {run['commit'][:12]}; 95% intervals"))


__all__ = ["build_report", "fisher_p", "sign_flip_p", "t_interval"]
