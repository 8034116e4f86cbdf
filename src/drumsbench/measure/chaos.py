"""The checks of a chaos run that the ledger alone answers (``drumsbench chaos``, docs/chaos.md).

- ``survived``: every attempt recorded when an event struck is still there, unchanged (each event
  keeps a ``RowsDigest`` of the rows at that moment; the same seqs must give the same count and
  digest at the end).
- ``counted_once``: no seq twice, and no attempt recorded twice under two seqs (same task, worker,
  start and end).
- ``classified``: the attempts each event touched ended in a consistent outcome: after a harness
  kill or a stop on a full disk nothing recorded straddles the moment it was seen dead (in-flight attempts
  are dropped, never half written) and what ran after it took new seqs (the dropped work is retried
  under them); an attempt in flight when a sandbox, container or desktop process was killed is
  recorded, and if invalid, with an infrastructure cause, and if of the oracle policy, never failed
  unless the event was one the policy could have caused itself (``sandbox_kill``); events on the
  ledger alone (a reader, a full disk it ran through) make no attempt invalid.
- ``ledger_intact``: ``PRAGMA integrity_check`` is ``ok`` at the end and after every full disk.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from drumsbench.core.outcome import InvalidCause
from drumsbench.ledger import Ledger
from drumsbench.measure.artifacts import ChaosCheck, ChaosEventArtifact, RowsDigest, load

# events that kill something a running attempt uses
SANDBOX_EVENTS = ("sandbox_kill", "container_kill", "desktop_kill", "vm_kill", "daemon_kill")
# sandbox events the policy's own code could have caused alike (killing one of its own processes):
# an attempt they hit may end failed; after any other sandbox event an attempt of a policy that
# solves every task (``SOLVER``) must end success or invalid
POLICY_REACHABLE_EVENTS = ("sandbox_kill",)
SOLVER = "oracle"
# events after which the harness is dead (and is resumed)
STOP_EVENTS = ("harness_kill",)
# the causes an attempt hit by a killed sandbox, container or desktop process may carry
INFRA_CAUSES = frozenset({InvalidCause.SUBSTRATE_FAILURE, InvalidCause.STEP_TIMEOUT, InvalidCause.EPISODE_TIMEOUT,
                          InvalidCause.VERIFIER_UNAVAILABLE, InvalidCause.BAD_OBSERVATION,
                          InvalidCause.DIRTY_RESET})


def digest(ledger: Ledger, run_id: str, max_seq: int | None = None, gaps: list[int] | None = None) -> RowsDigest:
    """The run's attempts as a ``RowsDigest``; with ``max_seq`` and ``gaps`` (of an earlier digest)
    only the rows that digest covered, for comparing with it. Attempts are recorded out of seq order
    (an attempt in flight may end after a later one), so the gaps below ``max_seq`` are part of it."""
    rows = ledger.db.execute(
        "SELECT seq, outcome, cause, t_end FROM attempts WHERE run_id = ? AND (? IS NULL OR seq <= ?) ORDER BY seq",
        (run_id, max_seq, max_seq)).fetchall()
    top = max_seq if max_seq is not None else (rows[-1][0] if rows else -1)
    if gaps is None:
        gaps = sorted(set(range(top + 1)) - {r[0] for r in rows})
    skip = set(gaps)
    h = hashlib.sha256()
    n = 0
    for seq, outcome, cause, t_end in rows:
        if seq not in skip:
            h.update(f"{seq}|{outcome}|{cause}|{t_end!r}\n".encode())
            n += 1
    return RowsDigest(n=n, max_seq=top, gaps=gaps, sha256=h.hexdigest())


def _rows(ledger: Ledger, run_id: str) -> list[tuple[int, str, str | None, float, float]]:
    return [(int(r[0]), r[1], r[2], float(r[3]), float(r[4])) for r in ledger.db.execute(
        "SELECT seq, outcome, cause, t_start, t_end FROM attempts WHERE run_id = ? ORDER BY seq", (run_id,))]


def _solver_seqs(ledger: Ledger, run_id: str) -> set[int]:
    """The seqs whose policy solves every task by construction (``oracle``)."""
    return {int(r[0]) for r in ledger.db.execute(
        "SELECT seq FROM attempts WHERE run_id = ? AND policy = ?", (run_id, SOLVER))}


def survived(ledger: Ledger, run_id: str, events: list[ChaosEventArtifact]) -> ChaosCheck:
    problems = []
    for ev in events:
        now = digest(ledger, run_id, ev.before.max_seq, ev.before.gaps)
        if now.n < ev.before.n:
            problems.append(f"event {ev.index} ({ev.kind}): {ev.before.n - now.n} of its {ev.before.n} recorded "
                            f"attempts lost")
        elif now.n != ev.before.n or now.sha256 != ev.before.sha256:
            problems.append(f"event {ev.index} ({ev.kind}): the {ev.before.n} attempts recorded then changed")
    counts = ", ".join(f"{e.before.n}->{e.attempts_after}" for e in events if e.kind in (*STOP_EVENTS, "disk_full"))
    return ChaosCheck(passed=not problems, detail="; ".join(problems[:5]) or
                      f"all attempts recorded at each of {len(events)} events are still there"
                      + (f" (recorded at each kill -> after: {counts})" if counts else ""))


def counted_once(ledger: Ledger, run_id: str) -> ChaosCheck:
    n, distinct = ledger.db.execute("SELECT COUNT(*), COUNT(DISTINCT seq) FROM attempts WHERE run_id = ?",
                                    (run_id,)).fetchone()
    twice = ledger.db.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM attempts WHERE run_id = ? GROUP BY task, worker, t_start, t_end "
        "HAVING COUNT(*) > 1)", (run_id,)).fetchone()[0]
    problems = []
    if n != distinct:
        problems.append(f"{n - distinct} seq(s) recorded twice")
    if twice:
        problems.append(f"{twice} attempt(s) recorded twice under different seqs")
    return ChaosCheck(passed=not problems, detail="; ".join(problems) or f"{n} attempts, {distinct} distinct seqs")


def classified(ledger: Ledger, run_id: str, events: list[ChaosEventArtifact]) -> ChaosCheck:
    rows = _rows(ledger, run_id)
    problems: list[str] = []
    touched: Counter[str] = Counter()
    # an attempt in flight at a kill is that kill's, even when it ends during a later reader's hold
    solver = _solver_seqs(ledger, run_id)
    killed = {s for ev in events if ev.kind in SANDBOX_EVENTS for s, _, _, t0, t1 in rows if t0 <= ev.t <= t1}
    for ev in events:
        stopped = ev.kind in STOP_EVENTS or (ev.kind == "disk_full" and ev.harness_exit is not None)
        if stopped:
            dead = ev.stopped_t if ev.stopped_t is not None else ev.t
            half = [s for s, _, _, t0, t1 in rows if t0 < dead < t1]
            reused = [s for s, _, _, t0, _ in rows if t0 > dead and s <= ev.before.max_seq]
            if half:
                problems.append(f"event {ev.index} ({ev.kind}): seq {half[0]} was in flight when the harness died "
                                f"yet recorded")
            if reused:
                problems.append(f"event {ev.index} ({ev.kind}): seq {reused[0]} reused after the harness died")
            touched["dropped and retried"] += 1
        elif ev.kind in SANDBOX_EVENTS:
            hit = [(s, o, c) for s, o, c, t0, t1 in rows if t0 <= ev.t <= t1]
            for s, o, c in hit:
                touched[f"{o}/{c}" if c else o] += 1
                if o == "failed" and s in solver and ev.kind not in POLICY_REACHABLE_EVENTS:
                    problems.append(f"event {ev.index} ({ev.kind}): seq {s} of the {SOLVER} policy scored 0 (failed): "
                                    f"an infrastructure fault taken for the policy's")
                if c is not None and InvalidCause(c) not in INFRA_CAUSES:
                    problems.append(f"event {ev.index} ({ev.kind}): seq {s} invalid with {c}, not an "
                                    f"infrastructure cause")
        else:  # the ledger alone: a reader, or a full disk the harness ran through
            hold = ev.hold_s or 0.0
            ended = [(s, c) for s, _, c, _, t1 in rows if ev.t <= t1 <= ev.t + hold + 1.0]
            touched[f"{ev.kind}: recorded"] += len(ended)
            bad = [s for s, c in ended if c is not None and s not in killed]
            if bad:
                problems.append(f"event {ev.index} ({ev.kind}): seq {bad[0]} made invalid by an event on the "
                                f"ledger alone")
    summary = ", ".join(f"{k} {v}" for k, v in sorted(touched.items()))
    return ChaosCheck(passed=not problems, detail="; ".join(problems[:5]) or f"every event's attempts classified "
                      f"({summary or 'none in flight'})")


def ledger_intact(ledger: Ledger, events: list[ChaosEventArtifact]) -> ChaosCheck:
    now = str(ledger.db.execute("PRAGMA integrity_check").fetchone()[0])
    bad = [f"event {e.index}: {e.integrity}" for e in events if e.integrity not in (None, "ok")]
    if now != "ok":
        bad.append(f"at the end: {now}")
    return ChaosCheck(passed=not bad, detail="; ".join(bad[:5]) or "integrity_check ok at the end and after "
                      f"{sum(e.integrity is not None for e in events)} full disk(s)")


def judge(ledger: Ledger, run_id: str) -> dict[str, ChaosCheck]:
    """The ledger-only checks of the chaos run ``run_id`` (its ``chaos-event`` artifacts)."""
    events = sorted(load(ledger, run_id, ChaosEventArtifact).values(), key=lambda e: e.index)
    return {"survived": survived(ledger, run_id, events), "counted_once": counted_once(ledger, run_id),
            "classified": classified(ledger, run_id, events), "ledger_intact": ledger_intact(ledger, events)}
