"""The small pieces every section is made of: escaped cells, numbers, tables, plot rows, colours, CDFs."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from html import escape

import numpy as np

from drumsbench.measure.stats import Estimate
from drumsbench.report import svg
from drumsbench.report.html.data import RunData
from drumsbench.report.svg import RangeRow, Series

CDF_POINTS = 200


class Raw(str):
    """HTML that is already escaped."""


class Keyed:
    """A table cell with a stable ``data-key`` (what the page tests compare against the JSON)."""

    def __init__(self, key: str, content: object) -> None:
        self.key, self.content = key, content


def _h(x: object) -> str:
    return x if isinstance(x, Raw) else escape(str(x))


def fmt_num(v: float | None, spec: str = ".3g") -> str:
    """``format(v, spec)``, but 1,000 <= |v| < 1e9 is written in full (54,650, not 5.465e+04)."""
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    out = f"{v:{spec}}"
    if "e+" in out and abs(v) < 1e9:
        return f"{v:,.0f}"
    return out


def fmt_est(e: Estimate | None, spec: str = ".3g", factor: float = 1.0, unit: str = "") -> Raw:
    if e is None or e.value is None:
        return Raw('<span class="na">n/a</span>')
    u = f" {unit}" if unit else ""
    v = fmt_num(e.value * factor, spec)
    if e.low is None or e.high is None:
        return Raw(f"{escape(v)}{escape(u)}")
    lo, hi = fmt_num(e.low * factor, spec), fmt_num(e.high * factor, spec)
    return Raw(f'{escape(v)}{escape(u)} <span class="ci" title="95% interval, {escape(e.method)}, n={e.n}">'
               f'[{escape(lo)}, {escape(hi)}]</span>')


def fmt_ms(x: Estimate) -> Raw:
    return fmt_est(x, ".3g", 1000)


def table(head: Sequence[object], rows: Iterable[Sequence[object]], cls: str = "", row_cls: Sequence[str] = (),
          left: int | set[int] = 1) -> str:
    """A table; text columns (the first ``left``, or those in the set) align left, numbers right in ``num``."""
    def is_left(j: int) -> bool:
        return j < left if isinstance(left, int) else j in left

    th = "".join(f'<th class="{"l" if is_left(i) else "r"}">{_h(c)}</th>' for i, c in enumerate(head))
    out = [f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>']
    for i, r in enumerate(rows):
        rc = f' class="{row_cls[i]}"' if i < len(row_cls) and row_cls[i] else ""
        out.append(f"<tr{rc}>" + "".join(_td(c, is_left(j)) for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _td(c: object, left: bool) -> str:
    cls = " class=l" if left else ""
    if isinstance(c, Keyed):
        return f'<td{cls} data-key="{escape(c.key)}">{_h(c.content)}</td>'
    return f"<td{cls}>{_h(c)}</td>"


def plot_row(*items: str) -> str:
    """Plots in a wrapping row, each captioned with its title (the SVG's aria-label)."""
    out = []
    for p in items:
        if not p:
            continue
        m = re.search(r'aria-label="([^"]*)"', p)
        cap = f'<div class="cap">{m.group(1)}</div>' if m else ""
        out.append(f'<div class="pl">{cap}{p}</div>')
    return '<div class="plots">' + "".join(out) + "</div>"


class Palette:
    """A stable colour per key (run, or run and substrate) across every plot of the page."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def __call__(self, key: str) -> str:
        if key not in self.keys:
            self.keys[key] = svg.color(len(self.keys))
        return self.keys[key]


def color_key(rd: RunData, sub: str) -> str:
    """Colour key of a (run, substrate): the run's own colour when the run used one substrate."""
    subs = set(rd.samples) | {a.substrate for a in rd.art.coldstart.values()} | \
        {a.substrate for a in rd.art.projection.values()}
    return rd.label if len(subs) <= 1 else f"{rd.label}/{sub}"


def legend(rd: RunData, runs: Sequence[RunData], what: str = "") -> str:
    if len(runs) == 1:
        return what or rd.label
    return f"{rd.label} · {what}" if what else rd.label


def cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(values)
    if len(x) <= CDF_POINTS:
        return x, np.arange(1, len(x) + 1) / len(x)
    p = np.linspace(0, 1, CDF_POINTS + 1)
    return np.quantile(x, p), p


def log_scale(values: Sequence[float], floor: float = 1e-9) -> bool:
    """Whether values (positive) spread over more than a factor of 20: then they are plotted on a log axis."""
    return bool(values) and max(values) / max(min(values), floor) > 20


def box_ms(label: str, samples_s: Sequence[float], color: str) -> RangeRow | None:
    """A box plot row of samples in seconds, drawn in ms (box: IQR, whiskers: p5–p95); None without samples."""
    if not len(samples_s):
        return None
    q = np.quantile(samples_s, [0.05, 0.25, 0.5, 0.75, 0.95]) * 1000
    return RangeRow(label, q[2], q[0], q[4], q[1], q[3], color=color)


def cdf_plot(series: list[Series], title: str) -> str:
    xs = [v for s in series for v in s.x if v is not None and v > 0]
    log = log_scale(xs)
    return svg.xy_plot(series, "milliseconds" + (" (log scale)" if log else ""), "% of samples ≤ x", title=title,
                       log_x=log, y_min=0, y_max=100, width=520, height=260)


def time_bins(times: np.ndarray, span: float, nbins: int = 40) -> tuple[np.ndarray, np.ndarray, float]:
    nbins = max(1, min(nbins, int(span) if span >= 1 else 1))
    counts = np.histogram(np.clip(times, 0, span), bins=nbins, range=(0, span))[0] if span > 0 else np.zeros(1)
    width = span / nbins if span > 0 else 1.0
    centres = (np.arange(nbins) + 0.5) * width
    return centres, counts, width
