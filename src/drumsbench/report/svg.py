"""Small inline-SVG plots for the HTML report: no JavaScript, no fonts, no requests.

Three kinds, all returning an ``<svg class="plot">`` string:
- ``xy_plot``: lines and/or markers with optional error bars (CDFs, sweeps, time series);
- ``range_plot``: one horizontal row per label: a box (q1..q3), whiskers (lo..hi) and a value mark
  (box plots of latency, intervals of cost figures);
- ``stacked_bars``: one horizontal 100 % bar per label split into named parts (outcomes).

Every drawn mark carries a ``<title>`` so a browser shows its numbers on hover. Sizes are in user
units of the viewBox; the page's CSS scales the SVG to its column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22")
FONT = 11
CHAR_W = 6.6  # approximate width of one character at FONT px (DejaVu/Liberation Sans), for layout only


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def num(v: float | None) -> str:
    """Short human form of a tick or tooltip number."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 1e-3:
        return f"{v:.4g}"
    return f"{v:.2g}"


def _a(text: object) -> str:
    return escape(str(text), quote=True)


# -- axes -------------------------------------------------------------------------------------------

def _nice_step(span: float, target: int = 5) -> float:
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


@dataclass
class Axis:
    lo: float
    hi: float
    log: bool
    ticks: list[float]

    def frac(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)


def make_axis(values: Sequence[float], log: bool = False, lo: float | None = None, hi: float | None = None,
              integer: bool = False) -> Axis:
    vals = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    vmin = min(vals) if vals else (1.0 if log else 0.0)
    vmax = max(vals) if vals else (10.0 if log else 1.0)
    if lo is not None:
        vmin = min(vmin, lo) if not log else lo
    if hi is not None:
        vmax = max(vmax, hi)
    if log:
        vmin, vmax = max(vmin, 1e-12), max(vmax, 1e-12)
        if vmax <= vmin * 1.0001:
            vmin, vmax = vmin / 2, vmax * 2
        a, b = vmin / 1.15, vmax * 1.15
        ticks = []
        for k in range(math.floor(math.log10(a)), math.ceil(math.log10(b)) + 1):
            for m in (1, 2, 5):
                t = m * 10.0 ** k
                if a <= t <= b:
                    ticks.append(t)
        if len(ticks) > 9:
            ticks = [t for t in ticks if f"{t:e}".startswith("1")]
        if len(ticks) < 2:
            step = _nice_step(b - a, 3)
            ticks = [round(step * i, 12) for i in range(math.ceil(a / step), math.floor(b / step) + 1)]
            ticks = [t for t in ticks if t > 0]
        return Axis(a, b, True, ticks)
    if vmax <= vmin:
        vmin, vmax = (vmin - 1, vmax + 1) if vmin != 0 else (0.0, 1.0)
    step = _nice_step(vmax - vmin)
    if integer:
        step = max(1.0, round(step))
    a = math.floor(vmin / step) * step if lo is None else lo
    b = math.ceil(vmax / step) * step if hi is None else hi
    if b <= a:
        b = a + step
    ticks = [round(step * i, 12) for i in range(math.ceil(a / step - 1e-9), math.floor(b / step + 1e-9) + 1)]
    return Axis(a, b, False, ticks)


# -- xy plot ----------------------------------------------------------------------------------------

@dataclass
class Series:
    name: str
    x: Sequence[float | None]
    y: Sequence[float | None]
    color: str = PALETTE[0]
    mode: str = "lines"  # "lines", "markers", "lines+markers"
    lo: Sequence[float | None] | None = None  # error bars on y
    hi: Sequence[float | None] | None = None
    hollow: Sequence[bool] | None = None  # per point: an open marker (e.g. an unconfirmed window)
    dash: bool = False
    tips: Sequence[str] | None = None  # per point tooltip


@dataclass
class Rule:
    """A vertical (``axis='x'``) or horizontal (``axis='y'``) dashed reference line with a label."""

    at: float
    label: str
    axis: str = "x"
    color: str = "#444"


@dataclass
class Frame:
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    parts: list[str] = field(default_factory=list)

    @property
    def pw(self) -> float:
        return self.width - self.left - self.right

    @property
    def ph(self) -> float:
        return self.height - self.top - self.bottom


def _legend(items: list[tuple[str, str, bool]], width: int, y0: float, left: int) -> tuple[list[str], float]:
    """Legend rows under the plot: (name, color, dashed). Returns (svg parts, height used)."""
    parts: list[str] = []
    x: float = left
    y = y0
    row_h = FONT + 6
    for name, col, dashed in items:
        w = 22 + len(name) * CHAR_W + 14
        if x + w > width - 4 and x > left:
            x, y = left, y + row_h
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        parts.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{col}" stroke-width="2.5"{dash}/>'
                     f'<text x="{x + 21}" y="{y}" class="lg">{_a(name)}</text>')
        x += w
    return parts, (y - y0 + row_h) if items else 0.0


def _svg(width: int, height: float, body: list[str], title: str) -> str:
    h = math.ceil(height)
    return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {h}" width="{width}" '
            f'height="{h}" role="img" aria-label="{_a(title)}"><title>{_a(title)}</title>'
            f'<rect class="bg" x="0" y="0" width="{width}" height="{h}"/>' + "".join(body) + "</svg>")


def _axes(f: Frame, xa: Axis, ya: Axis, x_label: str, y_label: str, x_fmt=num, y_fmt=num) -> None:
    p = f.parts
    x0, y0, pw, ph = f.left, f.top, f.pw, f.ph
    p.append(f'<rect class="area" x="{x0}" y="{y0}" width="{pw:.1f}" height="{ph:.1f}"/>')
    for t in ya.ticks:
        y = y0 + ph * (1 - ya.frac(t))
        p.append(f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x0 + pw:.1f}" y2="{y:.1f}"/>'
                 f'<text class="tk" x="{x0 - 5}" y="{y + 3.5:.1f}" text-anchor="end">{_a(y_fmt(t))}</text>')
    for t in xa.ticks:
        x = x0 + pw * xa.frac(t)
        p.append(f'<line class="grid" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + ph:.1f}"/>'
                 f'<text class="tk" x="{x:.1f}" y="{y0 + ph + 14:.1f}" text-anchor="middle">{_a(x_fmt(t))}</text>')
    p.append(f'<line class="ax" x1="{x0}" y1="{y0 + ph:.1f}" x2="{x0 + pw:.1f}" y2="{y0 + ph:.1f}"/>'
             f'<line class="ax" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph:.1f}"/>')
    p.append(f'<text class="al" x="{x0 + pw / 2:.1f}" y="{y0 + ph + 30:.1f}" text-anchor="middle">{_a(x_label)}</text>')
    if y_label:
        cy = y0 + ph / 2
        p.append(f'<text class="al" x="13" y="{cy:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 13 {cy:.1f})">{_a(y_label)}</text>')


def xy_plot(series: Sequence[Series], x_label: str, y_label: str, *, title: str = "", log_x: bool = False,
            log_y: bool = False, y_min: float | None = None, y_max: float | None = None,
            x_min: float | None = None, x_integer: bool = False, rules: Sequence[Rule] = (),
            width: int = 560, height: int = 280, x_fmt=num, y_fmt=num, legend: bool = True) -> str:
    xs = [v for s in series for v in s.x if v is not None]
    ys = [v for s in series for v in (*s.y, *(s.lo or []), *(s.hi or [])) if v is not None]
    xs += [r.at for r in rules if r.axis == "x"]
    ys += [r.at for r in rules if r.axis == "y"]
    xa = make_axis(xs, log_x, lo=x_min, integer=x_integer)
    ya = make_axis(ys, log_y, lo=y_min, hi=y_max)
    f = Frame(width, height, left=58, top=12, right=16, bottom=42)
    _axes(f, xa, ya, x_label, y_label, x_fmt, y_fmt)

    def px(v: float) -> float:
        return f.left + f.pw * min(1.0, max(0.0, xa.frac(v)))

    def py(v: float) -> float:
        return f.top + f.ph * (1 - min(1.0, max(0.0, ya.frac(v))))

    p = f.parts
    for r in rules:
        if r.axis == "x":
            x = px(r.at)
            p.append(f'<line class="rule" x1="{x:.1f}" y1="{f.top}" x2="{x:.1f}" y2="{f.top + f.ph:.1f}" '
                     f'stroke="{r.color}"><title>{_a(r.label)}</title></line>'
                     f'<text class="rl" x="{x + 3:.1f}" y="{f.top + 11}" fill="{r.color}">{_a(r.label)}</text>')
        else:
            y = py(r.at)
            p.append(f'<line class="rule" x1="{f.left}" y1="{y:.1f}" x2="{f.left + f.pw:.1f}" y2="{y:.1f}" '
                     f'stroke="{r.color}"><title>{_a(r.label)}</title></line>'
                     f'<text class="rl" x="{f.left + f.pw - 3:.1f}" y="{y - 3:.1f}" text-anchor="end" '
                     f'fill="{r.color}">{_a(r.label)}</text>')
    for s in series:
        pts = [(px(x), py(y)) for x, y in zip(s.x, s.y, strict=True)
               if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
        if not pts:
            continue
        if "lines" in s.mode and len(pts) > 1:
            d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            dash = ' stroke-dasharray="5 3"' if s.dash else ""
            p.append(f'<path class="ln" d="{d}" stroke="{s.color}"{dash}><title>{_a(s.name)}</title></path>')
        for i, (xv, yv) in enumerate(zip(s.x, s.y, strict=True)):
            if xv is None or yv is None or not (math.isfinite(xv) and math.isfinite(yv)):
                continue
            x, y = xv, yv
            lo = s.lo[i] if s.lo else None
            hi = s.hi[i] if s.hi else None
            tip = s.tips[i] if s.tips else f"{s.name}: {num(x)}, {num(y)}" + (
                f" [{num(lo)}, {num(hi)}]" if lo is not None and hi is not None else "")
            if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
                cx, y1, y2 = px(x), py(lo), py(hi)
                p.append(f'<path class="eb" d="M{cx:.1f},{y1:.1f} L{cx:.1f},{y2:.1f} M{cx - 4:.1f},{y1:.1f} '
                         f'L{cx + 4:.1f},{y1:.1f} M{cx - 4:.1f},{y2:.1f} L{cx + 4:.1f},{y2:.1f}" stroke="{s.color}"/>')
            if "markers" in s.mode:
                hollow = bool(s.hollow[i]) if s.hollow else False
                fill = "#fff" if hollow else s.color
                p.append(f'<circle class="mk" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{fill}" '
                         f'stroke="{s.color}"><title>{_a(tip)}</title></circle>')
    height_used = float(height)
    if legend and series:
        items = [(s.name, s.color, s.dash) for s in series]
        parts, h = _legend(items, width, height + 2, f.left)
        p.extend(parts)
        height_used += h
    return _svg(width, height_used, p, title or f"{y_label} against {x_label}")


# -- range plot (box plots, intervals) ---------------------------------------------------------------

@dataclass
class RangeRow:
    label: str
    value: float | None
    lo: float | None = None
    hi: float | None = None
    q1: float | None = None
    q3: float | None = None
    color: str = PALETTE[0]
    tip: str = ""


def range_plot(rows: Sequence[RangeRow], x_label: str, *, title: str = "", log_x: bool = False,
               x_min: float | None = None, width: int = 560, x_fmt=num) -> str:
    label_w = min(260, max(60, int(max((len(r.label) for r in rows), default=4) * CHAR_W) + 14))
    row_h = 24
    height = 12 + row_h * max(1, len(rows)) + 42
    vals = [v for r in rows for v in (r.value, r.lo, r.hi, r.q1, r.q3) if v is not None]
    xa = make_axis(vals, log_x, lo=x_min)
    ya = Axis(0, max(1, len(rows)), False, [])
    f = Frame(width, height, left=label_w, top=12, right=16, bottom=42)
    _axes(f, xa, ya, x_label, "", x_fmt)
    p = f.parts

    def px(v: float) -> float:
        return f.left + f.pw * min(1.0, max(0.0, xa.frac(v)))

    for i, r in enumerate(rows):
        cy = f.top + row_h * i + row_h / 2
        label = r.label if len(r.label) * CHAR_W < label_w - 10 else r.label[: int((label_w - 10) / CHAR_W) - 1] + "…"
        p.append(f'<text class="tk" x="{f.left - 6}" y="{cy + 3.5:.1f}" text-anchor="end">{_a(label)}'
                 f'<title>{_a(r.label)}</title></text>')
        tip = r.tip or (f"{r.label}: {num(r.value)}" + (f" [{num(r.lo)}, {num(r.hi)}]" if r.lo is not None else ""))
        g = [f'<g class="rg"><title>{_a(tip)}</title>']
        if r.lo is not None and r.hi is not None:
            g.append(f'<path class="eb" d="M{px(r.lo):.1f},{cy:.1f} L{px(r.hi):.1f},{cy:.1f} '
                     f'M{px(r.lo):.1f},{cy - 5:.1f} L{px(r.lo):.1f},{cy + 5:.1f} '
                     f'M{px(r.hi):.1f},{cy - 5:.1f} L{px(r.hi):.1f},{cy + 5:.1f}" stroke="{r.color}"/>')
        if r.q1 is not None and r.q3 is not None:
            x1, x2 = px(r.q1), px(r.q3)
            g.append(f'<rect class="box" x="{x1:.1f}" y="{cy - 7:.1f}" width="{max(1.5, x2 - x1):.1f}" height="14" '
                     f'fill="{r.color}" stroke="{r.color}"/>')
        if r.value is not None:
            x = px(r.value)
            if r.q1 is not None:
                g.append(f'<line x1="{x:.1f}" y1="{cy - 8:.1f}" x2="{x:.1f}" y2="{cy + 8:.1f}" stroke="#111" '
                         f'stroke-width="2"/>')
            else:
                g.append(f'<circle class="mk" cx="{x:.1f}" cy="{cy:.1f}" r="4" fill="{r.color}" stroke="{r.color}"/>')
        g.append("</g>")
        p.append("".join(g))
    return _svg(width, height, p, title or x_label)


# -- stacked bars -----------------------------------------------------------------------------------

def stacked_bars(rows: Sequence[tuple[str, Sequence[tuple[str, float, str]]]], *, title: str = "",
                 x_label: str = "share of attempts", width: int = 560) -> str:
    """rows: (label, [(part name, count, color), ...]); each bar is 100 % of its row's total."""
    label_w = min(260, max(60, int(max((len(r[0]) for r in rows), default=4) * CHAR_W) + 14))
    row_h = 26
    height = 12 + row_h * max(1, len(rows)) + 42
    xa = Axis(0.0, 1.0, False, [0, 0.25, 0.5, 0.75, 1.0])
    ya = Axis(0, max(1, len(rows)), False, [])
    f = Frame(width, height, left=label_w, top=12, right=16, bottom=42)
    _axes(f, xa, ya, x_label, "", lambda v: f"{v * 100:.0f}%")
    p = f.parts
    seen: dict[str, str] = {}
    for name, col in ((n, c) for _, parts in rows for n, v, c in parts if v > 0):
        seen.setdefault(name, col)
    for i, (label, parts) in enumerate(rows):
        cy = f.top + row_h * i + row_h / 2
        total = sum(v for _, v, _ in parts) or 1
        p.append(f'<text class="tk" x="{f.left - 6}" y="{cy + 3.5:.1f}" text-anchor="end">{_a(label)}</text>')
        x = float(f.left)
        for name, v, col in parts:
            w = f.pw * v / total
            if w <= 0:
                continue
            p.append(f'<rect class="bar" x="{x:.2f}" y="{cy - 8:.1f}" width="{w:.2f}" height="16" fill="{col}">'
                     f'<title>{_a(label)} — {_a(name)}: {int(v)} ({v / total * 100:.2f}%)</title></rect>')
            x += w
    parts_l, h = _legend([(n, c, False) for n, c in seen.items()], width, height + 2, f.left)
    p.extend(parts_l)
    return _svg(width, height + h, p, title or x_label)
