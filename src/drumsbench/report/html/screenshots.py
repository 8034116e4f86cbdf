"""Screenshots from the desktop environment and its branches, embedded as ``data:`` URIs."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from html import escape
from pathlib import Path

from drumsbench.measure.artifacts import ScreenshotArtifact
from drumsbench.report.html.cells import Palette
from drumsbench.report.html.data import RunData

MAX_SCREENSHOTS = 60  # per run


def _image(a: ScreenshotArtifact, base: Path | None) -> tuple[str, bytes] | None:
    data: bytes | None = None
    if a.png_base64:
        try:
            data = base64.b64decode(a.png_base64, validate=True)
        except (binascii.Error, ValueError):
            return None
    elif a.path and base is not None:
        p = (base / a.path).resolve()
        if not p.is_relative_to(base.resolve()):
            return None  # a screenshot is read from the ledger's folder, nowhere else
        try:
            data = p.read_bytes()
        except OSError:
            return None
    if not data:
        return None
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png", data
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg", data
    return None  # only raster images are embedded: nothing that could reference another resource


def sec_screenshots(runs: Sequence[RunData], pal: Palette, base: Path | None) -> str | None:
    if not any(rd.art.screenshots for rd in runs):
        return None
    out = []
    for rd in runs:
        shots = rd.art.screenshots
        if not shots:
            continue
        by_task: dict[str, list[tuple[str, ScreenshotArtifact]]] = {}
        for name, a in shots.items():
            by_task.setdefault(a.task, []).append((name, a))
        shown = 0
        if len(runs) > 1:
            out.append(f"<h3>{escape(rd.label)}</h3>")
        for task, items in by_task.items():
            figs = []
            for name, a in items:
                if shown >= MAX_SCREENSHOTS:
                    break
                img = _image(a, base)
                cap = " · ".join(str(x) for x in (a.method, a.seq, a.stage, a.note) if x is not None) or name
                key = f"{rd.label}/screenshot/{name}"
                if img is None:
                    figs.append(f'<figure class="shot missing" data-key="{escape(key)}"><div>image not available</div>'
                                f'<figcaption>{escape(cap)}</figcaption></figure>')
                    continue
                mime, data = img
                style = f' style="max-width:{min(a.width, 480)}px"' if a.width else ' style="max-width:480px"'
                figs.append(f'<figure class="shot" data-key="{escape(key)}"><img alt="{escape(task)} {escape(cap)}"'
                            f'{style} src="data:{mime};base64,{base64.b64encode(data).decode()}">'
                            f'<figcaption>{escape(cap)}</figcaption></figure>')
                shown += 1
            out.append(f'<h4>{escape(task)}</h4><div class="shots">{"".join(figs)}</div>')
        if len(shots) > shown:
            out.append(f'<p class="note">{len(shots) - shown} more screenshot(s) in the ledger not shown.</p>')
    return "".join(out)
