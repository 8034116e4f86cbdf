"""A chaos run: its checks and its events (what was broken, when, and what followed)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from drumsbench.report.html.cells import Keyed, Palette, Raw, table
from drumsbench.report.html.data import RunData

CHECK_ORDER = ("survived", "counted_once", "classified", "ledger_intact", "gc_clean", "harness")


def _verdict(key: str, passed: bool) -> Keyed:
    return Keyed(key, Raw('<b class="ok">passed</b>' if passed else '<b class="bad">FAILED</b>'))


def sec_chaos(runs: Sequence[RunData], pal: Palette) -> str | None:
    """Per chaos run: each check with its detail, then one row per event (``chaos-event`` artifacts)."""
    items = [rd for rd in runs if rd.art.chaos is not None or rd.art.chaos_events]
    if not items:
        return None
    out: list[str] = []
    for rd in items:
        s = rd.art.chaos
        events = sorted(rd.art.chaos_events.values(), key=lambda e: e.index)
        if s is None:
            out.append(f'<h3>{escape(rd.label)}</h3><p class="err">{len(events)} events recorded but no verdict: '
                       "the chaos driver did not finish (run `drumsbench chaos --check RUN`)</p>")
        else:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(s.by_kind.items())) or "none"
            out.append(f"<h3>{escape(rd.label)}: {s.events} events ({escape(kinds)}), {s.attempts:,} attempts, "
                       f"{s.harness_starts} harness start(s) — "
                       f'{"<span class=ok>passed</span>" if s.passed else "<span class=bad>FAILED</span>"}</h3>')
            names = [n for n in CHECK_ORDER if n in s.checks] + [n for n in s.checks if n not in CHECK_ORDER]
            out.append(table(["check", "verdict", "detail"],
                             [[n, _verdict(f"{rd.label}/chaos/{n}", s.checks[n].passed), s.checks[n].detail]
                              for n in names], "small", left={0, 2}))
        rows: list[list[object]] = []
        t0 = events[0].t if events else 0.0
        for e in events:
            rows.append([e.index, f"+{e.t - t0:.1f} s", time.strftime("%H:%M:%S", time.gmtime(e.t)), e.kind,
                         e.target, e.harness_segment, e.before.n,
                         "" if e.attempts_after is None else e.attempts_after,
                         "" if e.harness_exit is None else e.harness_exit, e.followed])
        if rows:
            out.append(table(["#", "at", "UTC", "event", "target", "harness start", "recorded before",
                              "recorded after", "harness exit", "what followed"], rows, "small num",
                             left={3, 4, 9}))
    return ('<p class="note">Events injected from outside the harness while it ran (docs/chaos.md); '
            '"recorded before" counts the attempts in the ledger at the event (after the harness died, for a '
            'kill).</p>' + "".join(out))
