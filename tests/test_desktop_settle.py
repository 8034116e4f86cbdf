"""When a desktop step ends (envs/desktop/settle.py): on evidence, never before the action's effect.

One LibreOffice instance on the process substrate serves the module. A small real X application
(libxcb through ctypes under the system's Python, entered into the instance's namespaces, managed
by its openbox) stands for an application whose effect comes late: on a key press it is busy for a while, then
paints its window red. The quiet-period settle (the clock) observes the green window — a step
observed before its effect — while the evidence settle waits for the application's answer to a
ping and observes red. LibreOffice's own dialogs (opened and closed by keys) are observed with
their title in the same step. The quiet fallback is taken, bounded, when the application hangs.
No figure is asserted here: speed is benchmarks/desktop_settle.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import Action, ActionSpec, Observation
from drumsbench.envs.desktop import instance
from drumsbench.envs.desktop.env import DesktopEnv
from drumsbench.envs.desktop.instance import Settings
from drumsbench.envs.desktop.task import load_suite
from drumsbench.substrates.process import ProcessSubstrate

from conftest import require

APP_TITLE = "late-painter"
BUSY_S = 1.5  # the late application is busy this long after a key before it paints
# The application's window, as openbox places it (asked for at 100,100; its title bar adds a little).
PROBE = (300, 260)  # (x, y) well inside the window
GREEN, RED = (0, 255, 0), (255, 0, 0)

# A minimal EWMH client through libxcb (ctypes, the system's Python: no toolkit needed). A key turns
# a green window red after BUSY seconds of work (the event loop does not run meanwhile; the red is
# painted before the next event is read); a key on a red window turns it green at once. It answers
# _NET_WM_PING from its event loop, as LibreOffice does.
LATE_PAINTER = '''
import ctypes, os, signal, struct, sys, time
busy, pid_file, lifetime, title = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
signal.alarm(lifetime)
x = ctypes.CDLL("libxcb.so.1")
libc = ctypes.CDLL("libc.so.6")
vp, u8, u16, u32, i16 = ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int16
class Cookie(ctypes.Structure): _fields_ = [("seq", ctypes.c_uint)]
class It(ctypes.Structure): _fields_ = [("data", vp), ("rem", ctypes.c_int), ("index", ctypes.c_int)]
class AtomReply(ctypes.Structure): _fields_ = [("rt", u8), ("pad", u8), ("seq", u16), ("len", u32), ("atom", u32)]
for name, res, args in [
    ("xcb_connect", vp, [ctypes.c_char_p, vp]), ("xcb_get_setup", vp, [vp]), ("xcb_setup_roots_iterator", It, [vp]),
    ("xcb_generate_id", u32, [vp]), ("xcb_flush", ctypes.c_int, [vp]), ("xcb_wait_for_event", vp, [vp]),
    ("xcb_create_window", Cookie, [vp, u8, u32, u32, i16, i16, u16, u16, u16, u16, u32, u32, vp]),
    ("xcb_map_window", Cookie, [vp, u32]), ("xcb_intern_atom", Cookie, [vp, u8, u16, ctypes.c_char_p]),
    ("xcb_intern_atom_reply", ctypes.POINTER(AtomReply), [vp, Cookie, vp]),
    ("xcb_change_property", Cookie, [vp, u8, u32, u32, u32, u8, u32, vp]),
    ("xcb_change_window_attributes", Cookie, [vp, u32, u32, vp]),
    ("xcb_clear_area", Cookie, [vp, u8, u32, i16, i16, u16, u16]),
    ("xcb_send_event", Cookie, [vp, u8, u32, u32, ctypes.c_char_p])]:
    f = getattr(x, name); f.restype = res; f.argtypes = args
libc.free.argtypes = [vp]
c = x.xcb_connect(None, None)
root = ctypes.cast(x.xcb_setup_roots_iterator(x.xcb_get_setup(c)).data, ctypes.POINTER(u32))[0]
def atom(name):
    r = x.xcb_intern_atom_reply(c, x.xcb_intern_atom(c, 0, len(name), name), None)
    v = r.contents.atom; libc.free(r); return v
PROTOCOLS, PING = atom(b"WM_PROTOCOLS"), atom(b"_NET_WM_PING")
GREEN, RED = 0x00FF00, 0xFF0000
win = x.xcb_generate_id(c)
values = (u32 * 2)(GREEN, 1 | (1 << 15))  # back pixel; KeyPress | Exposure
x.xcb_create_window(c, 0, win, root, 100, 100, 420, 320, 0, 1, 0, 2 | 0x800, values)
def prop(name, kind, fmt, data, n):
    x.xcb_change_property(c, 0, win, name, kind, fmt, n, data)
prop(39, 31, 8, title, len(title))  # WM_NAME, STRING
prop(PROTOCOLS, 4, 32, (u32 * 1)(PING), 1)
prop(35, 35, 32, (u32 * 9)(1, 1, 0, 0, 0, 0, 0, 0, 0), 9)  # WM_HINTS: takes input
x.xcb_map_window(c, win)
x.xcb_flush(c)
with open(pid_file, "w") as f:
    f.write(str(os.getpid()))
colour = GREEN
def paint(pixel):
    global colour
    colour = pixel
    x.xcb_change_window_attributes(c, win, 2, (u32 * 1)(pixel))
    x.xcb_clear_area(c, 0, win, 0, 0, 0, 0)
    x.xcb_flush(c)
while True:
    ev = x.xcb_wait_for_event(c)
    if not ev:
        break
    raw = ctypes.string_at(ev, 32); libc.free(ev)
    code = raw[0] & 0x7F
    if code == 2:  # KeyPress
        if colour == GREEN:
            time.sleep(busy)
            paint(RED)
        else:
            paint(GREEN)
    elif code == 33:  # ClientMessage
        kind, first = struct.unpack_from("=II", raw, 8)
        if kind == PROTOCOLS and first == PING:
            answer = raw[:4] + struct.pack("=I", root) + raw[8:]
            x.xcb_send_event(c, 0, root, (1 << 19) | (1 << 20), answer)
            x.xcb_flush(c)
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[DesktopEnv]:
    require(instance.missing())
    from drumsbench.envs.desktop.profile import template_profile

    template_profile()
    state = tmp_path_factory.mktemp("settle-state")
    sub = ProcessSubstrate("tsettle" + os.urandom(4).hex(), state)
    box = sub.create()
    e = DesktopEnv(artifact_dir=state / "art")
    e.attach(box)
    try:
        task = next(t for t in load_suite("desktop") if t.id == "writer-fix-typo")
        e.reset(task)
        yield e
    finally:
        e.stop()
        box.destroy()
        sub.close()
    assert sub.leftovers() == []


def use(env: DesktopEnv, **changes: object) -> None:
    """Switch the running environment's and instance's settle settings (the same instance)."""
    env.settings = env.instance.settings = dataclasses.replace(env.settings, **changes)  # type: ignore[arg-type]


def step(env: DesktopEnv, kind: str, **payload: object) -> Observation:
    obs = env.observe(10)
    return env.step(Action.of(ActionSpec(kind, dict(payload)), obs.generation), 30)


def colour(obs: Observation) -> tuple[int, int, int]:
    x, y = PROBE
    return tuple(int(v) for v in obs.content["screen"][y, x])  # type: ignore[return-value]


def wait_until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def late_app(env: DesktopEnv) -> Iterator[int]:
    """The late-painting application, focused and green; its pid (host view). Killed afterwards."""
    inst = env.instance
    script, pid_file = inst.home / "late_painter.py", inst.home / "late_painter.pid"
    script.write_text(LATE_PAINTER)
    pid_file.unlink(missing_ok=True)
    command = f"setsid -f {instance.SYSTEM_PYTHON} {script} {BUSY_S} {pid_file} 120 {APP_TITLE}"
    res = inst.exec_inside(["/bin/sh", "-c", command + " </dev/null >/dev/null 2>&1"], 20, all_namespaces=True)
    assert res.exit_code == 0, res.stderr
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 20, "the late painter's pid file")
    inside_pid = int(pid_file.read_text())
    host_pid = inst.namespace_pids()[inside_pid]

    def ready() -> bool:
        frame = inst.grab()
        return frame.title == APP_TITLE and tuple(int(v) for v in frame.rgb[PROBE[1], PROBE[0]]) == GREEN

    wait_until(ready, 20, "the late painter's green window, focused")
    try:
        yield host_pid
    finally:
        with_signal(host_pid, signal.SIGCONT)
        with_signal(host_pid, signal.SIGKILL)
        use(env, settle_mode="evidence", settle_ping_timeout_s=Settings().settle_ping_timeout_s)
        wait_until(lambda: inst.title() != APP_TITLE, 10, "the late painter gone")


def with_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def back_to_green(env: DesktopEnv) -> None:
    inst = env.instance
    inst.xdotool(["key", "g"], 10)  # any key on a red window
    wait_until(lambda: tuple(int(v) for v in inst.grab().rgb[PROBE[1], PROBE[0]]) == GREEN, 10, "green again")


# -- the settings ------------------------------------------------------------------------------------
def test_an_unknown_settle_mode_is_refused_naming_the_field():
    with pytest.raises(UsageError, match=r"Settings\.settle_mode: 'clock' is not one of evidence, quiet"):
        Settings(settle_mode="clock")
    assert Settings().settle_mode == "evidence"


# -- premature screenshots ---------------------------------------------------------------------------
def test_the_quiet_period_observes_a_late_effect_too_early_and_the_evidence_does_not(env, late_app):
    # the clock: the screen stays still while the application is busy, so the quiet period ends
    # and the step is observed before its effect (the positive control: this test can see it)
    use(env, settle_mode="quiet")
    obs = step(env, "key", keys="r")
    assert obs.content["title"] == APP_TITLE
    assert colour(obs) == GREEN, "the quiet settle was expected to observe before the effect"
    assert env.instance.last_settle is not None and env.instance.last_settle.mode == "quiet"
    wait_until(lambda: tuple(int(v) for v in env.instance.grab().rgb[PROBE[1], PROBE[0]]) == RED, 10,
               "the late effect")
    back_to_green(env)

    # the evidence: the application answers the ping only once its handler has run
    use(env, settle_mode="evidence")
    t = time.monotonic()
    obs = step(env, "key", keys="r")
    report = env.instance.last_settle
    assert colour(obs) == RED, f"observed before the effect ({report})"
    assert obs.content["settled"] is True
    assert report is not None and report.mode == "evidence" and report.fallback == "", report
    assert report.rounds >= 2 and report.grabs >= 2, report  # answered pings, a second grab compared
    assert time.monotonic() - t >= BUSY_S * 0.9  # it did wait for the application


def test_a_hung_application_falls_back_to_the_bounded_quiet_period(env, late_app):
    use(env, settle_mode="evidence", settle_ping_timeout_s=0.5)
    os.kill(late_app, signal.SIGSTOP)  # hung: no answer to pings, nothing drawn
    t = time.monotonic()
    obs = step(env, "key", keys="r")
    elapsed = time.monotonic() - t
    report = env.instance.last_settle
    assert report is not None and "did not answer a ping within 0.5 s" in report.fallback, report
    s = env.settings
    assert elapsed < s.settle_max_s + s.settle_quiet_s + 3.0  # bounded (xdotool and a loaded host on top)
    assert obs.content["png"] and obs.content["problem"] is None
    os.kill(late_app, signal.SIGCONT)


# -- LibreOffice ----------------------------------------------------------------------------------------
def test_libreoffice_dialogs_are_observed_in_the_step_that_opens_and_closes_them(env):
    use(env, settle_mode="evidence")
    for _ in range(3):
        obs = step(env, "key", keys="ctrl+h")
        assert obs.content["title"] == "Find and Replace", env.instance.last_settle
        assert obs.content["settled"] is True, env.instance.last_settle
        obs = step(env, "key", keys="Escape")
        assert obs.content["title"] == "start.odt - LibreOffice Writer", env.instance.last_settle
        assert env.instance.last_settle is not None and env.instance.last_settle.fallback == ""


def test_typed_text_is_in_the_observation_of_its_step(env):
    use(env, settle_mode="evidence")
    step(env, "key", keys="ctrl+End")
    before = env.observe(10).content["screen"]
    obs = step(env, "type", text="MMMM")
    changed = np.any(obs.content["screen"] != before, axis=2)
    assert int(changed.sum()) > 200  # four wide glyphs, far beyond the blinking cursor
    report = env.instance.last_settle
    assert report is not None and report.mode == "evidence" and report.fallback == "" and report.settled, report


def test_watch_reports_drawing_and_libreoffice_answers_pings(env):
    inst = env.instance
    with inst.client(3) as x:
        x.watch()
        window, title, _focus = x.snapshot()
        assert title == "start.odt - LibreOffice Writer" and x.answers_ping(window)
        full = (0, 0, x.width, x.height)
        assert not [e for e in x.events(0) if e.kind == "damage" and e.area == full]  # creation's report dropped
        inst.xdotool(["type", "--delay", "8", "WWW"], 10)
        x.ping(window, 7)
        seen: list = []
        end = time.monotonic() + 10
        while not any(e.kind == "pong" and e.value == 7 for e in seen) and time.monotonic() < end:
            seen += x.events(end - time.monotonic())
        assert any(e.kind == "pong" and e.value == 7 and e.window == window for e in seen)
        end = time.monotonic() + 2
        while sum(e.area[2] * e.area[3] for e in seen if e.kind == "damage") <= 100 and time.monotonic() < end:
            seen += x.events(end - time.monotonic())
        assert sum(e.area[2] * e.area[3] for e in seen if e.kind == "damage") > 100
