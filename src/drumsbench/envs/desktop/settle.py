"""When a desktop step is over: on evidence from the X server and the application, or on a clock.

``quiet`` (the clock): grab every ``settle_interval_s`` until the screen has been still for
``settle_quiet_s`` (frames equal within ``settle_tolerance_px``, the same title). It cannot tell a
still screen from an application that has not drawn yet: an effect that comes later than the
quiet period is observed before it happened, and every step pays the quiet period.

``evidence`` (the default): one X connection for the whole wait, which sees

- every drawing anywhere on the screen (a DAMAGE object on the root window);
- windows mapped, unmapped, moved and the active window changing (the root's substructure and
  property events), and the focus and the active window's title, read each round;
- the application's own word that it has read the input: an EWMH ``_NET_WM_PING`` sent to the
  active window, which the application answers from its event loop only after it has read and
  dispatched every event queued before the ping — the action's key or click (xdotool's events
  reach the server before this connection exists);
- that the application has no work queued after answering: the main thread of the process the
  active window names (``_NET_WM_PID``) asleep in ``/proc`` (LibreOffice runs an accelerator's
  dispatch from an event it posts to itself, after answering the ping).

A round is one ping and its answer. The step is over when a round saw no drawing beyond the pixel
tolerance (the blinking text cursor), no window, focus or title change and the application
asleep; then a frame is grabbed; after a further quiet round, ``settle_evidence_quiet_s`` after the
last activity and — when windows were created, mapped, moved or destroyed during the wait (the
window manager's work, which answers no ping) — ``settle_wm_quiet_s`` after the last of those, a
second frame is grabbed and must equal the first (within the tolerance, same title) with nothing
drawn since: a screenshot taken too early is caught by the difference and the wait goes on.
Grabs go through shared memory (``XClient.grab_view``) and are compared with memcmp.

Fallback to ``quiet`` (bounded by ``settle_max_s``; the reason is in ``SettleReport.fallback``):
the server has no DAMAGE extension, the active window does not take pings (none, or LibreOffice
closed: an empty desktop) and stays so for ``settle_wm_quiet_s``, or the application did not
answer within ``settle_ping_timeout_s`` (hung, or busy that long).

Not seen by either mode: what an application draws later from a timer while its event loop is
free. LibreOffice refreshes toolbar and status-bar states that way (its bindings update about
0.3 s after a change, and the text cursor blinks every 0.5 s); those show in the next observation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from drumsbench.envs.desktop import xcb

SettleMode = Literal["evidence", "quiet"]
SETTLE_MODES: tuple[str, ...] = ("evidence", "quiet")
# windows appearing, going or moving: the window manager's work (it answers no ping)
_STRUCTURE = frozenset({"create", "destroy", "map", "unmap", "reparent", "configure"})
_WINDOW_EVENTS = _STRUCTURE | {"property", "error", "other"}


@dataclass
class Frame:
    rgb: np.ndarray
    title: str
    t: float = field(default_factory=time.monotonic)


def frames_differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many pixels differ between two frames."""
    if a.shape != b.shape:
        return int(a.shape[0] * a.shape[1])
    return int(np.count_nonzero(np.any(a != b, axis=2)))


@dataclass(frozen=True)
class SettleReport:
    """How the last wait ended: ``mode`` used, ``settled``, ``seconds`` spent, ``rounds`` of pings
    answered, ``grabs`` taken, ``fallback`` ("" unless the evidence wait fell back to the quiet
    period: why) and ``busy`` (answered rounds after which the application's main thread was still
    running)."""

    mode: str
    settled: bool
    seconds: float
    rounds: int = 0
    grabs: int = 0
    fallback: str = ""
    busy: int = 0


@dataclass(frozen=True)
class SettleParams:
    """The settle knobs of ``instance.Settings`` (passed as they are)."""

    interval_s: float
    quiet_s: float
    max_s: float
    tolerance_px: int
    grab_timeout_s: float
    ping_timeout_s: float
    evidence_quiet_s: float
    wm_quiet_s: float


def settle_quiet(grab: Callable[[float], Frame], p: SettleParams, deadline: float, first: Frame | None,
                 quiet: float) -> tuple[Frame, SettleReport]:
    """Grab until the screen has been still for ``quiet`` seconds (frames equal within the pixel
    tolerance, the same title), or ``deadline`` / ``max_s + quiet``. ``xcb.XError`` when the server fails."""
    t0 = time.monotonic()
    end = min(deadline, t0 + p.max_s + quiet)
    prev = first or grab(p.grab_timeout_s)
    grabs = 0 if first else 1
    still_since = prev.t
    while True:
        remaining = end - time.monotonic()
        if remaining <= 0:
            return prev, SettleReport("quiet", False, time.monotonic() - t0, grabs=grabs)
        time.sleep(min(p.interval_s, remaining))
        cur = grab(min(p.grab_timeout_s, max(0.5, deadline - time.monotonic())))
        grabs += 1
        if cur.title != prev.title or frames_differ(cur.rgb, prev.rgb) > p.tolerance_px:
            still_since = cur.t
        elif cur.t - still_since >= quiet:
            return cur, SettleReport("quiet", True, time.monotonic() - t0, grabs=grabs)
        prev = cur


class _Fallback(Exception):
    """The evidence is not available: fall back to the quiet period (the message says why)."""


def settle_evidence(connect: Callable[[float], xcb.XClient], grab: Callable[[float], Frame], p: SettleParams,
                    deadline: float, asleep: Callable[[int], bool | None] | None = None) -> tuple[Frame, SettleReport]:
    """Wait until the screen and the application say the step is over (module docstring), else fall
    back to ``settle_quiet`` for the time left. ``connect(timeout)`` opens an ``xcb.XClient`` (not
    entered); ``grab(timeout)`` is the quiet mode's screenshot; ``asleep(pid)`` (optional) tells
    whether the main thread of the process the active window names (``_NET_WM_PID``) is asleep,
    waiting for input or a timer (None: unknown). ``xcb.XTimeout`` when the server does not answer;
    ``xcb.XError`` when it fails."""
    t0 = time.monotonic()
    end = min(deadline, t0 + p.max_s + p.quiet_s)
    evidence_end = min(deadline, t0 + p.max_s)
    counts = {"rounds": 0, "grabs": 0, "busy": 0}
    try:
        with connect(min(p.grab_timeout_s, max(0.5, deadline - t0))) as x:
            frame = _evidence_loop(x, p, evidence_end, counts, asleep)
            if frame is not None:
                return frame, SettleReport("evidence", True, time.monotonic() - t0, counts["rounds"], counts["grabs"],
                                           busy=counts["busy"])
            reason = f"no quiet round within {p.max_s:g} s"
    except _Fallback as e:
        reason = str(e)
    frame, quiet = settle_quiet(grab, p, end, None, p.quiet_s)
    return frame, SettleReport("evidence", quiet.settled, time.monotonic() - t0, counts["rounds"],
                               counts["grabs"] + quiet.grabs, fallback=reason, busy=counts["busy"])


def _evidence_loop(x: xcb.XClient, p: SettleParams, end: float, counts: dict[str, int],
                   asleep: Callable[[int], bool | None] | None) -> Frame | None:
    """Rounds of ping, answer and events until two grabs agree after quiet rounds; None at ``end``."""
    try:
        x.watch()
    except xcb.XTimeout:
        raise
    except xcb.XError as e:
        raise _Fallback(f"no damage events: {e}") from None
    token, window = 0, 0
    state: tuple[int, str, int] | None = None
    last_activity = time.monotonic()
    last_structure = -float("inf")  # when a window was last created, mapped, moved or destroyed
    pids: dict[int, int] = {}  # window -> its _NET_WM_PID
    candidate: np.ndarray | None = None  # the first grab after a quiet round (BGRX as the server sent it)
    slot = 0  # the shared-memory buffer holding the candidate; the next grab goes into the other
    while time.monotonic() < end:
        pinged = window if window and x.answers_ping(window) else 0
        if pinged:
            token += 1
            x.ping(pinged, token)  # in flight while the state is read
        now_state = x.snapshot(window)
        if now_state != state:
            state, candidate, last_activity = now_state, None, time.monotonic()
            window = now_state[0]
            if window != pinged:
                if not x.answers_ping(window) and _stays(x, now_state, p):
                    raise _Fallback(_unpingable(now_state))
                continue
        elif not pinged:
            raise _Fallback(_unpingable(now_state))
        answer = _answer(x, token, p, end)
        if answer == "end":
            return None
        if answer == "refused":  # the window went (a dialog closed) between reading and pinging it
            candidate, last_activity = None, time.monotonic()
            continue
        counts["rounds"] += 1
        events = x.events(0)
        if _structure(events):
            last_structure = time.monotonic()
        # the answer says the input was read; a main thread still running after it has work queued
        # (LibreOffice runs an accelerator's dispatch from a posted event, after answering)
        busy = asleep is not None and asleep(pids.setdefault(window, x.window_pid(window))) is False
        if busy:
            counts["busy"] += 1
        if busy or _active(events, p):
            candidate, last_activity = None, time.monotonic()
            continue
        if candidate is None:
            candidate = x.grab_view(slot)
            counts["grabs"] += 1
            continue
        wait = max(last_activity + p.evidence_quiet_s, last_structure + p.wm_quiet_s) - time.monotonic()
        if wait > 0:  # then one more round: a fresh answer after the wait
            events = _collect(x, wait)
            if _structure(events):
                last_structure = time.monotonic()
            if _active(events, p):
                candidate, last_activity = None, time.monotonic()
            continue
        slot = 1 - slot
        second = x.grab_view(slot)
        counts["grabs"] += 1
        events = x.events(0)
        if x.snapshot(window) == state and not _active(events, p) and _same(second, candidate, x, p):
            return Frame(xcb.bgrx_to_rgb(second, x.width, x.height), state[1])
        if _structure(events):
            last_structure = time.monotonic()
        candidate, last_activity = second, time.monotonic()  # drawn between the grabs: one more round
    return None


def _structure(events: list[xcb.XEvent]) -> bool:
    return any(e.kind in _STRUCTURE for e in events)


def _same(a: np.ndarray, b: np.ndarray, x: xcb.XClient, p: SettleParams) -> bool:
    """Two grabs equal within the pixel tolerance (byte-equal in the usual case: no conversion)."""
    if xcb.same_bytes(a, b):
        return True
    return frames_differ(xcb.bgrx_to_rgb(a, x.width, x.height), xcb.bgrx_to_rgb(b, x.width, x.height)) <= p.tolerance_px


def _answer(x: xcb.XClient, token: int, p: SettleParams, end: float) -> str:
    """Collect events until the answer to ping ``token`` ("answered"; the events seen on the way are
    put back for the caller), an X error ("refused": the window is gone, no answer will come) or
    ``end`` ("end"). ``_Fallback`` when no answer comes within the ping timeout."""
    sent = time.monotonic()
    seen: list[xcb.XEvent] = []
    while True:
        left = min(end, sent + p.ping_timeout_s) - time.monotonic()
        if left <= 0:
            if time.monotonic() >= end:
                return "end"
            raise _Fallback(f"the application did not answer a ping within {p.ping_timeout_s:g} s")
        for e in x.events(left):
            if e.kind == "pong" and e.value == token:
                x.unread(seen)
                return "answered"
            if e.kind == "error":
                return "refused"
            seen.append(e)


def _unpingable(state: tuple[int, str, int]) -> str:
    window, title, _focus = state
    return f"the active window ({window:#x} {title!r}) does not answer _NET_WM_PING" if window else "no active window"


def _stays(x: xcb.XClient, state: tuple[int, str, int], p: SettleParams) -> bool:
    """Is ``state`` still the state after ``wm_quiet_s``? (A window that cannot be pinged is often a
    passing one: a dialog just destroyed that the window manager still names as the active window.)"""
    end = time.monotonic() + max(p.wm_quiet_s, p.evidence_quiet_s)
    while (left := end - time.monotonic()) > 0:
        if _structure(x.events(left)) or x.snapshot(state[0]) != state:
            return False
    return x.snapshot(state[0]) == state


def _collect(x: xcb.XClient, seconds: float) -> list[xcb.XEvent]:
    """Events for ``seconds`` (returns early at the first activity)."""
    stop = time.monotonic() + seconds
    out: list[xcb.XEvent] = []
    while (left := stop - time.monotonic()) > 0:
        out += x.events(left)
        if out:
            return out
    return out


def _active(events: list[xcb.XEvent], p: SettleParams) -> bool:
    """Drawing beyond the pixel tolerance, or a window / focus change, among ``events``."""
    drawn = 0
    for e in events:
        if e.kind in _WINDOW_EVENTS:
            return True
        if e.kind == "damage":
            drawn += e.area[2] * e.area[3]
    return drawn > p.tolerance_px
