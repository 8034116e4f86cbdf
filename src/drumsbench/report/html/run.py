"""The sections every run has: headline cards, outcomes, per task, positive controls, conditions."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from html import escape
from typing import Any

from drumsbench.core.outcome import InvalidCause
from drumsbench.measure.stats import inverse
from drumsbench.report import svg
from drumsbench.report.html.cells import Palette, Raw, fmt_est, plot_row, table
from drumsbench.report.html.data import RunData, throughput_basis


def sec_headline(runs: Sequence[RunData], pal: Palette) -> str:
    cards = []
    for rd in runs:
        r = rd.report
        head = (f'<div class="card" style="border-top-color:{pal(rd.label)}"><div class="rid">{escape(rd.label)}</div>'
                f'<div class="sub">{escape(r.kind)}, {escape(r.status)} · '
                f'{escape(str(r.config.get("substrate", r.config.get("substrates", "?"))))} · {r.attempts:,} attempts'
                f'</div>')
        if not rd.has_attempts:
            cards.append(head + f'<div class="lbl">a {escape(r.kind)} run records no rollouts: its figures are in '
                                f'the sections below</div></div>')
            continue
        thr, basis = throughput_basis(rd)
        price = rd.prices[0] if rd.prices else None
        k = escape(rd.label)
        if thr is None or price is None:
            money = (f'<div class="big na" data-key="{k}/headline/usd">no headline</div>'
                     f'<div class="lbl">{escape(basis)}</div>')
        else:
            usd = inverse(thr, price.usd_per_host_hour)
            money = (f'<div class="big" data-key="{k}/headline/usd">USD {fmt_est(usd, ".3g")}</div>'
                     f'<div class="lbl">per valid rollout — <b data-key="{k}/headline/basis">{escape(basis)}</b> '
                     f'({escape(price.name)}: USD {price.usd_per_host_hour:g}/host-hour; host cost only, inference '
                     f'excluded)</div><div class="mid" data-key="{k}/headline/valid_per_host_hour">'
                     f'{fmt_est(thr, ".4g")}</div>'
                     f'<div class="lbl">valid rollouts per host-hour — {escape(basis)}</div>')
        iso = ("fired" if r.isolation_confirmed else "DID NOT FIRE — isolation unconfirmed") if r.controls \
            else "not run — isolation unconfirmed"
        iso_cls = "ok" if r.isolation_confirmed else "bad"
        cards.append(
            head + money +
            f'<div class="mid">{fmt_est(r.invalid_rate, ".2%")}</div><div class="lbl">invalid rate '
            f'({r.invalid_total:,} of {r.attempts:,})</div>'
            f'<div class="lbl" data-key="{escape(rd.label)}/headline/trust">{escape(r.trust_line())}</div>'
            f'<div class="ctl {iso_cls}">isolation positive control: {escape(iso)}</div></div>')
    return '<div class="cards">' + "".join(cards) + "</div>"


def sec_outcomes(runs: Sequence[RunData], pal: Palette) -> str | None:
    runs = [rd for rd in runs if rd.has_attempts]
    if not runs:
        return None
    head = ["outcome"] + [rd.label for rd in runs]
    rows: list[list[object]] = []
    cls: list[str] = []

    def add(name: str, vals: list[object], c: str = "") -> None:
        rows.append([name, *vals])
        cls.append(c)

    reps = [rd.report for rd in runs]
    add("attempts", [f"{r.attempts:,}" for r in reps], "tot")
    add("valid (success + failed)", [f"{r.valid:,} ({_pct(r.valid, r.attempts)})" for r in reps], "tot")
    add("valid-success (reward 1)", [f"{r.success:,} ({_pct(r.success, r.attempts)})" for r in reps], "ok")
    add("valid-failed (reward 0)", [f"{r.failed:,} ({_pct(r.failed, r.attempts)})" for r in reps], "")
    add("invalid (no reward, never scored 0)", [f"{r.invalid_total:,} ({_pct(r.invalid_total, r.attempts)})"
                                               for r in reps], "bad tot")
    for cause in InvalidCause:
        vals: list[object] = []
        for r in reps:
            k = r.invalid[cause.value]
            inj = r.injected[cause.value]
            caught = r.injected_caught[cause.value]
            note = f' <span class="note">{inj:,} injected, {caught:,} caught</span>' if inj else ""
            vals.append(Raw(f"{k:,} ({_pct(k, r.attempts)}){note}"))
        add(f"invalid: {cause.value}", vals, "cause")
    add("invalid, not injected (real faults)", [f"{r.invalid_not_injected:,}" for r in reps], "")
    add("success rate over valid", [fmt_est(r.success_rate, ".3f") for r in reps], "")
    add("invalid rate", [fmt_est(r.invalid_rate, ".3%") for r in reps], "")
    t = table(head, rows, "num outcomes", cls)
    bars = []
    inv_colors = ["#b2182b", "#d6604d", "#f4a582", "#e08214", "#8073ac", "#542788", "#c51b7d", "#7f3b08", "#40004b"]
    for rd in runs:
        r = rd.report
        parts = [("valid-success", r.success, "#1a9850"), ("valid-failed", r.failed, "#91bfdb")]
        parts += [(f"invalid: {c}", r.invalid[c], inv_colors[i % len(inv_colors)])
                  for i, c in enumerate(r.invalid)]
        bars.append((rd.label, parts))
    plot = svg.stacked_bars(bars, title="outcomes: share of attempts", width=760)
    return t + plot_row(plot)


def _pct(k: int, n: int) -> str:
    return f"{k / n * 100:.2f}%" if n else "–"


def sec_tasks(runs: Sequence[RunData], pal: Palette) -> str | None:
    names = sorted({t for rd in runs for t in rd.report.tasks})
    if not names:
        return None
    head = ["task"] + [rd.label for rd in runs]
    rows: list[list[object]] = []
    for t in names:
        row: list[object] = [t]
        for rd in runs:
            line = rd.report.tasks.get(t)
            row.append("–" if line is None else Raw(
                f'{line.attempts:,}: <span class="ok">{line.success:,} success</span>, {line.failed:,} failed, '
                f'<span class="{"bad" if line.invalid else ""}">{line.invalid:,} invalid</span>'))
        rows.append(row)
    return table(head, rows, "num small")


def sec_controls(runs: Sequence[RunData], pal: Palette) -> str:
    rows: list[list[object]] = []
    for rd in runs:
        if not rd.report.controls:
            rows.append([rd.label, "–", "isolation", Raw('<b class="bad">not run</b>'),
                         "no positive control ran: isolation unconfirmed"])
        for c in rd.report.controls:
            rows.append([rd.label, c.window or "(run)", c.kind,
                         Raw('<b class="ok">fired</b>' if c.fired else '<b class="bad">DID NOT FIRE</b>'), c.detail])
    summary = "".join(
        f'<li>{escape(rd.label)}: isolation '
        f'{"<b class=ok>confirmed</b>" if rd.report.isolation_confirmed else "<b class=bad>unconfirmed</b>"}</li>'
        for rd in runs)
    return f"<ul>{summary}</ul>" + table(["run", "window", "kind", "fired", "detail"], rows, "small")


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    out[prefix[:-1]] = json.dumps(d) if isinstance(d, (list, bool)) or d is None else str(d)
    return out


def sec_conditions(runs: Sequence[RunData], pal: Palette) -> str:
    flats = []
    for rd in runs:
        r, run = rd.report, rd.run
        f = {"run id": rd.label, "kind": r.kind, "status": r.status,
             "created (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.get("created", 0))),
             "commit": r.commit, "host time": f"{r.host_seconds:,.1f} s in {r.segments} segment(s)"}
        f.update(_flat(r.machine, "machine."))
        f.update(_flat(r.config, "config."))
        for p in rd.prices:
            f[f"price input: {p.name}"] = (f"USD {p.usd_per_host_hour:.4g}/host-hour"
                                           + (f" ({p.kind})" if p.kind else "") + (f" — {p.note}" if p.note else ""))
            if p.inputs:
                f[f"price input: {p.name}: inputs"] = json.dumps(p.inputs)
        if rd.art.other_kinds:
            f["other artifacts in the ledger"] = ", ".join(f"{k} ({n})" for k, n in sorted(rd.art.other_kinds.items()))
        for kind, why in rd.art.errors.items():
            f[f"unreadable artifacts: {kind}"] = why
        flats.append(f)
    keys: list[str] = []
    for f in flats:
        keys += [k for k in f if k not in keys]
    order = ("machine.", "config.", "price input", "other")
    keys.sort(key=lambda k: next((i + 1 for i, p in enumerate(order) if k.startswith(p)), 0))  # stable
    rows, cls = [], []
    for k in keys:
        vals = [f.get(k, "–") for f in flats]
        rows.append([k, *vals])
        differs = len(runs) > 1 and len(set(vals)) > 1 and k not in ("run id", "created (UTC)")
        cls.append("diff" if differs else "")
    note = '<p class="note">Rows that differ between the runs are highlighted.</p>' if len(runs) > 1 else ""
    return note + table(["", *[rd.label for rd in runs]], rows, "small kv", cls)
