"""A desktop instance inside a VM guest (``vm``): the same holder, X server, window manager and
LibreOffice as on the host, reached only through the sandbox's own channel.

Process tree (guest view)::

    agent (guest init) ── unshare --fork --pid --ipc --uts --net     (setsid, GuestLaunching)
                            └─ holder.py = pid 1 of the instance's namespaces
                                 ├─ Xvfb :0 -fbdir <tmp>/fb
                                 └─ openbox --startup soffice ...  (UNO on a named pipe)

- The guest is the sandbox: one instance per guest, display ``:0``, the X socket in the guest's
  ``/tmp/.X11-unix`` (no mount namespace of its own, as in a checkpointable instance).
- The screen: Xvfb keeps its framebuffer in a file (``-fbdir``, XWD format) that the harness reads
  through the guest agent (about 0.2 s for 1280x800 under TCG); the active window's title comes
  from ``xdotool`` (an X client: a stopped X server never answers it, which is how a frozen screen
  shows, as on the host). Steps settle in "quiet" mode (``Settings.settle_mode``: the evidence mode
  needs an X connection of the harness's own), each grab taken once the X server and LibreOffice
  are asleep (their ``/proc/<pid>/stat`` read through the agent): a still screen alone ended steps
  while LibreOffice was still working through typed text.
- The verifier and capture reach LibreOffice through UNO on a named pipe (a unix socket in the
  guest's /tmp): no network namespace has to be entered.
- A policy's shell action is not offered: commands run as the guest's root, which could stop the X
  server or LibreOffice itself.

Under software emulation (TCG) everything is slower: LibreOffice shows its window about 16-20 s after
launch (about 0.2 s on the host), so the start and grab timeouts are raised (``for_guest``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import struct
import time
from pathlib import Path, PurePosixPath

import numpy as np

from drumsbench.core.errors import SubstrateError
from drumsbench.envs.desktop import kiosk, saver, xcb
from drumsbench.envs.desktop.instance import DISPLAY, HOLDER, HOSTNAME, SAVER, SYSTEM_PYTHON, Settings
from drumsbench.envs.desktop.profile import COMPLETE, PROFILE_NAME, SOFFICE, verified_template
from drumsbench.envs.desktop.running import RunningDesktop
from drumsbench.envs.desktop.settle import Frame, SettleReport, settle_quiet
from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, GuestLaunching, Sandbox

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
XWD_HEADER = struct.Struct(">25I")
# Forces the screen saver on through libxcb (the guest has no xset): the black-screen fault. The
# GetScreenSaver round trip before the disconnect is what makes it take: the X server answers only
# after it has run the requests before, whereas a client that hangs up right after writing them may
# have them dropped unread (on epoll the server closes a connection whose socket reports a hang-up,
# EPOLLHUP, without reading what is left in it; under TCG about half the blanks were lost so).
BLANK_SCRIPT = """
import ctypes
class Cookie(ctypes.Structure):
    _fields_ = [("sequence", ctypes.c_uint)]
class Saver(ctypes.Structure):  # xcb_get_screen_saver_reply_t
    _fields_ = [("response_type", ctypes.c_uint8), ("pad0", ctypes.c_uint8), ("sequence", ctypes.c_uint16),
                ("length", ctypes.c_uint32), ("timeout", ctypes.c_uint16), ("interval", ctypes.c_uint16),
                ("prefer_blanking", ctypes.c_uint8), ("allow_exposures", ctypes.c_uint8)]
x = ctypes.CDLL("libxcb.so.1")
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
x.xcb_connect.restype = ctypes.c_void_p
for f, n in (("xcb_connection_has_error", 0), ("xcb_set_screen_saver", 4), ("xcb_force_screen_saver", 1),
             ("xcb_get_screen_saver", 0), ("xcb_disconnect", 0)):
    getattr(x, f).argtypes = [ctypes.c_void_p] + [ctypes.c_int] * n
x.xcb_get_screen_saver.restype = Cookie
x.xcb_get_screen_saver_reply.argtypes = [ctypes.c_void_p, Cookie, ctypes.c_void_p]
x.xcb_get_screen_saver_reply.restype = ctypes.POINTER(Saver)
c = x.xcb_connect(b":%d", None)
if x.xcb_connection_has_error(c):
    raise SystemExit("no X server")
x.xcb_set_screen_saver(c, 0, 0, 0, 1)  # no timeout, DontPreferBlanking, AllowExposures
x.xcb_force_screen_saver(c, 1)  # ScreenSaverActive
r = x.xcb_get_screen_saver_reply(c, x.xcb_get_screen_saver(c), None)
got = None if not r else (r.contents.timeout, r.contents.prefer_blanking, r.contents.allow_exposures)
libc.free(r)
x.xcb_disconnect(c)
if got != (0, 0, 1):
    raise SystemExit(f"the X server did not take the screen saver's settings (GetScreenSaver: {got})")
"""


def for_guest(settings: Settings) -> Settings:
    """``settings`` as a guest runs them: quiet settling, and timeouts that fit software emulation."""
    return dataclasses.replace(
        settings, settle_mode="quiet", start_timeout_s=max(settings.start_timeout_s, 180.0),
        grab_timeout_s=max(settings.grab_timeout_s, 10.0), settle_max_s=max(settings.settle_max_s, 8.0),
        wm_first=True)


@functools.cache
def _profile_files(template: Path) -> dict[str, bytes]:
    """The template profile's files (relative path -> bytes), read once per process: every reset
    copies them into the guest."""
    return {p.relative_to(template).as_posix(): p.read_bytes()
            for p in sorted(template.rglob("*")) if p.is_file() and p.name != COMPLETE}


def parse_xwd(data: bytes) -> np.ndarray:
    """RGB pixels (height x width x 3) of an XWD file as Xvfb's ``-fbdir`` keeps it (32 bits a pixel,
    least significant byte first: BGRX)."""
    if len(data) < XWD_HEADER.size:
        raise xcb.XError(f"framebuffer file too short ({len(data)} bytes)")
    h = XWD_HEADER.unpack_from(data)
    header_size, width, height, byte_order, bpp, bpl, ncolors = h[0], h[4], h[5], h[7], h[11], h[12], h[19]
    if bpp != 32 or bpl != width * 4 or byte_order != 0:
        raise xcb.XError(f"framebuffer is not 32-bit LSB-first ({bpp} bits a pixel, {bpl} bytes a line)")
    start = header_size + 12 * ncolors
    pixels = data[start:start + bpl * height]
    if len(pixels) != bpl * height:
        raise xcb.XError("framebuffer file is shorter than its header says")
    return xcb.bgrx_to_rgb(pixels, width, height)


class GuestInstance(RunningDesktop):
    """A desktop in a VM guest (``GuestLaunching``): see the module's docstring."""

    IDLE_WAIT_S = 3.0  # how long a settle's grab waits for the X server and LibreOffice to sleep

    def __init__(self, box: Sandbox, settings: Settings | None = None) -> None:
        if not isinstance(box, GuestLaunching):
            raise SubstrateError(f"desktop: a guest instance needs a GuestLaunching sandbox, not {box.substrate}")
        self.box = box
        self.guest: GuestLaunching = box
        self.settings = for_guest(settings or Settings())
        self.display = DISPLAY
        self.t_launch = 0.0
        self.restored = False
        self.holder_pid = None  # no host process: the guest's
        self.last_settle: SettleReport | None = None
        paths = box.paths
        self.work, self.home, self.tmp = paths.work, paths.home, paths.tmp
        self.profile = f"{self.home}/{PROFILE_NAME}"
        self.fb_dir = f"{self.tmp}/.drumsbench-fb"
        self.log = f"{self.tmp}/.drumsbench-launch.err"
        self._exit_file = f"{self.tmp}/.drumsbench-app-exit"
        self.launcher_pid: int | None = None  # guest pid of unshare (its child is the holder)
        self._busy_pids: list[int] = []  # guest pids of Xvfb and soffice.bin (``_busy``)

    # -- paths -----------------------------------------------------------------------------------
    def inside(self, path: str | Path) -> str:
        return str(path)

    @property
    def work_inside(self) -> str:
        return self.work

    @property
    def profile_inside(self) -> Path:
        return Path(self.profile)

    @property
    def app_exit_inside(self) -> str:
        return self._exit_file

    @property
    def policy_uid(self) -> int | None:
        return None

    def uno_connection(self) -> str:
        return f"pipe,name=drumsbench-{self.display}"

    # -- guest commands --------------------------------------------------------------------------
    def _sh(self, script: str, timeout: float, *args: str, limit: int = 65536) -> ExecResult:
        return self.box.exec(["/bin/sh", "-c", script, "sh", *args], timeout=timeout, cwd="/",
                             env={"PATH": GUEST_PATH}, output_limit=limit)

    def _checked(self, script: str, what: str, *args: str, timeout: float = 60.0) -> str:
        res = self._sh(script, timeout, *args)
        if res.exit_code != 0 or res.timed_out:
            raise SubstrateError(f"desktop (guest): {what} failed (exit {res.exit_code}): "
                                 f"{res.stderr.decode(errors='replace')[-300:]}")
        return res.stdout.decode(errors="replace")

    def _read(self, path: str) -> bytes | None:
        try:
            return self.box.read_file(path)
        except (SubstrateError, OSError):  # missing (FileNotFoundError), or the sandbox is gone
            return None

    # -- life cycle ------------------------------------------------------------------------------
    def prepare(self) -> None:
        files = _profile_files(verified_template())
        self._checked('rm -rf "$1" "$2" "$3" && mkdir -p "$4" "$2"', "preparing the folders",
                      self.profile, self.fb_dir, self._exit_file, self.work)
        self.box.put_files(self.profile, files)

    def launch(self, document: str) -> None:
        s = self.settings
        env = {
            "PATH": GUEST_PATH, "HOME": self.home, "TMPDIR": self.tmp, "LANG": "C.UTF-8",
            "SAL_USE_VCLPLUGIN": "gen", "XDG_CONFIG_HOME": f"{self.home}/.config",
            "XDG_CACHE_HOME": f"{self.home}/.cache", "XDG_RUNTIME_DIR": self.tmp,
        }
        app = [SOFFICE, f"-env:UserInstallation={self.profile_inside.as_uri()}", "--norestore", "--nologo",
               f"--accept={self.uno_connection()};urp;StarOffice.ComponentContext", f"{self.work}/{document}"]
        cfg = {"hostname": HOSTNAME, "binds": [], "display": self.display, "screen": f"{s.width}x{s.height}x24",
               "env": env, "app": app, "wm_first": s.wm_first, "app_exit_file": self._exit_file,
               "xvfb_args": ["-fbdir", self.fb_dir], "x_timeout": 60.0}
        if s.wm_kiosk:
            rc = cfg["wm_rc"] = f"{self.tmp}/{kiosk.FILE_NAME}"
            self.box.write_file(rc, kiosk.RC_XML.encode())
        holder = f"{self.tmp}/.drumsbench-holder.py"
        self.box.write_file(holder, HOLDER.read_bytes())
        self.box.write_file(self._saver, SAVER.read_bytes())
        self.t_launch = time.monotonic()
        argv = ["unshare", "--fork", "--pid", "--ipc", "--uts", "--net", "--",
                SYSTEM_PYTHON, "-I", holder, json.dumps(cfg)]
        self.launcher_pid = self.guest.launch_detached(argv, env={"PATH": GUEST_PATH}, log=self.log)

    def _state(self, pid: int) -> bytes | None:
        """The guest process's state letter (``/proc/<pid>/stat``), None when there is none."""
        stat = self._read(f"/proc/{pid}/stat")
        return stat.rsplit(b")", 1)[1].split()[0] if stat is not None and b")" in stat else None

    def alive(self) -> bool:
        return self.launcher_pid is not None and self._state(self.launcher_pid) not in (None, b"Z")

    def stop(self) -> None:
        pid, self.launcher_pid = self.launcher_pid, None
        if pid is None:
            return
        # the holder (unshare's child) is the namespace's pid 1: its death ends every process in it
        with contextlib.suppress(SubstrateError):  # the sandbox is gone, and the instance with it
            self._sh('pkill -KILL -P "$1"; kill -KILL "$1"; exit 0', 30.0, str(pid))

    def launch_said(self) -> str:
        data = self._read(self.log)
        return (data or b"").decode(errors="replace").strip()[-300:]

    def sandbox_gone(self) -> bool:
        return False  # every call through a destroyed sandbox raises SubstrateError

    def app_exit(self) -> int | None:
        data = self._read(self._exit_file)
        if data is None:
            return None
        try:
            return int(data.decode().strip() or "-1")
        except ValueError:
            return None

    def app_running(self) -> bool:
        return self._sh("pgrep -x soffice.bin >/dev/null", 30.0).exit_code == 0

    # -- files -----------------------------------------------------------------------------------
    def work_files(self) -> dict[str, bytes]:
        out = self._checked('cd "$1" && find . -type f -print0', "listing the work folder", self.work)
        files: dict[str, bytes] = {}
        for rel in sorted(p for p in out.split("\0") if p):
            name = PurePosixPath(rel).as_posix()
            data = self._read(f"{self.work}/{name}")
            if data is not None:
                files[name] = data
        return files

    def write_work(self, name: str, data: bytes) -> None:
        self.box.put_files(self.work, {name: data})

    def remove_stale(self) -> None:
        self._checked('rm -f "$1"/.~lock.*# "$2/.lock" "/tmp/.X11-unix/X$3"', "removing stale locks",
                      self.work, self.profile, str(self.display))

    def profile_lock(self) -> str | None:
        data = self._read(f"{self.profile}/.lock")
        return None if data is None else data.decode(errors="replace")

    # -- the screen ------------------------------------------------------------------------------
    def _x(self, args: list[str], timeout: float) -> ExecResult:
        res = self.box.exec(["xdotool", *args], timeout=timeout, cwd="/",
                            env={"PATH": GUEST_PATH, "DISPLAY": f":{self.display}"}, output_limit=65536)
        if res.timed_out:
            raise xcb.XTimeout(f"the X server did not answer within {timeout:g} s")
        return res

    def title(self, timeout: float | None = None) -> str:
        res = self._x(["getactivewindow", "getwindowname"], timeout or self.settings.grab_timeout_s)
        if res.exit_code != 0:
            err = res.stderr.decode(errors="replace")
            if "Can't open display" in err or "Failed creating new xdo" in err:
                raise xcb.XError(f"no X server: {err.strip()[-200:]}")
            return ""  # no active window
        return res.stdout.decode(errors="replace").rstrip("\n")

    def _pixels(self) -> np.ndarray:
        data = self._read(f"{self.fb_dir}/Xvfb_screen0")
        if data is None:
            raise xcb.XError("no framebuffer file (the X server is not running)")
        return parse_xwd(data)

    def _busy(self) -> bool:
        """Is the X server or LibreOffice running or runnable (state R), i.e. still working through
        input, rather than asleep? Their guest pids are looked up when first needed."""
        if not self._busy_pids:
            out = self._sh("pgrep -x Xvfb; pgrep -x soffice.bin", 30.0).stdout.decode(errors="replace")
            self._busy_pids = [int(p) for p in out.split() if p.isdigit()]
        for pid in self._busy_pids:
            state = self._state(pid)
            if state is None:
                self._busy_pids = []  # gone (or not started yet): looked up again next time
                return False
            if state == b"R":
                return True
        return False

    def _grab_when_idle(self, timeout: float) -> Frame:
        """A grab once the X server and LibreOffice are asleep (at most ``IDLE_WAIT_S``): under
        software emulation LibreOffice may still be working through the input while the screen
        looks still, and two equal grabs then would end a step too early."""
        end = time.monotonic() + self.IDLE_WAIT_S
        while self._busy() and time.monotonic() < end:
            time.sleep(0.05)
        return self.grab(timeout)

    def grab(self, timeout: float | None = None) -> Frame:
        rgb = self._pixels()
        return Frame(rgb, self.title(timeout))

    def region(self, left: int, top: int, width: int, height: int,
               timeout: float | None = None) -> tuple[np.ndarray, str]:
        rgb = self._pixels()
        return rgb[top:top + height, left:left + width].copy(), self.title(timeout)

    def settle(self, deadline: float, first: Frame | None = None,
               quiet_s: float | None = None) -> tuple[Frame, bool]:
        s = self.settings
        frame, report = settle_quiet(self._grab_when_idle, s.settle_params(), deadline, first,
                                     s.settle_quiet_s if quiet_s is None else quiet_s)
        self.last_settle = report
        return frame, report.settled

    # -- fault injection -------------------------------------------------------------------------
    def blank(self) -> None:
        """The screen saver forced on in the guest (``BLANK_SCRIPT``, which waits for the X server to
        have run it), then confirmed where the observations read the screen: the framebuffer file
        must be black in every pixel, else ``SubstrateError`` (a fault that did not happen must not
        pass for one the gate missed)."""
        res = self.box.exec([SYSTEM_PYTHON, "-I", "-c", BLANK_SCRIPT % self.display], timeout=60.0, cwd="/",
                            env={"PATH": GUEST_PATH})
        if res.exit_code != 0 or res.timed_out:
            raise SubstrateError(f"desktop (guest): cannot blank the screen (exit {res.exit_code}): "
                                 f"{res.stderr.decode(errors='replace')[-200:]}")
        try:
            rgb = self._pixels()
        except xcb.XError as e:
            raise SubstrateError(f"desktop (guest): the blanked screen cannot be read: {e}") from None
        lit = int(np.count_nonzero(rgb.any(axis=2)))
        if lit:
            raise SubstrateError(f"desktop (guest): the screen saver was forced on, but {lit} pixels of the "
                                 "framebuffer are not black")

    @property
    def office_runs_as(self) -> str:
        return "root of the VM guest"

    @property
    def _saver(self) -> str:
        return f"{self.tmp}/.drumsbench-saver.py"

    def screen_saver(self) -> str:
        """Asked by ``saver.py`` run under the guest's Python (written next to the holder)."""
        res = self.box.exec([SYSTEM_PYTHON, "-I", self._saver, "/tmp/.X11-unix", str(self.display),
                             str(self.settings.grab_timeout_s)], timeout=30.0, cwd="/", env={"PATH": GUEST_PATH})
        said = res.stdout.decode(errors="replace").strip()
        if res.exit_code != 0 or res.timed_out or said not in saver.STATES.values():
            raise xcb.XError(f"screen saver state (guest): exit {res.exit_code} "
                             f"{res.stderr.decode(errors='replace').strip()[-200:]}")
        return said

    def freeze_display(self) -> None:
        self._checked("pkill -STOP -x Xvfb", "stopping the X server")

    # -- commands --------------------------------------------------------------------------------
    def exec_inside(self, argv: list[str], timeout: float, *, all_namespaces: bool = False,
                    output_limit: int = DEFAULT_OUTPUT_LIMIT, stdin: bytes | None = None,
                    as_sandbox_user: bool = False) -> ExecResult:
        if as_sandbox_user:
            raise SubstrateError(f"desktop: {self.shell_unavailable()}")
        env = {"PATH": GUEST_PATH, "DISPLAY": f":{self.display}", "HOME": self.home, "TMPDIR": self.tmp,
               "DRUMSBENCH_UNO": self.uno_connection()}
        return self.box.exec(argv, timeout=timeout, cwd=self.work, env=env, stdin=stdin, output_limit=output_limit)

    def shell_unavailable(self) -> str | None:
        return (f"shell actions are not offered on {self.box.substrate}: the guest's commands run as its root, "
                "which could stop the X server or LibreOffice (use process)")

