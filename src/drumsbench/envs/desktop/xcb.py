"""A short-lived X client from the harness side, through libxcb with ctypes (no Xlib, no mss).

Why not ``DISPLAY``: each desktop instance's X socket lives in the sandbox's own
``tmp/.X11-unix`` folder (bound over ``/tmp/.X11-unix`` inside the instance's mount namespace), and
the instance's network namespace hides the abstract socket. Xlib cannot be pointed at an arbitrary
socket path, so the harness connects a plain Unix socket to the path itself — through
``/proc/self/fd/<dirfd>/X<n>``, which keeps the path short of the 108-byte limit whatever the
sandbox's location — and hands the connected fd to ``xcb_connect_to_fd``.

Every operation opens a connection, does its work and closes it: no connection from the harness
stays open between calls (a checkpoint of the instance must not see an outside client). A server
that does not answer (stopped, wedged) is detected by a deadline: the socket is shut down from the
calling thread, which makes libxcb's blocking read return, and ``XTimeout`` is raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


class XError(Exception):
    """The X server refused the connection or a request failed."""


class XTimeout(XError):
    """The X server did not answer before the deadline (stopped or wedged)."""


class _Cookie(ctypes.Structure):
    _fields_ = [("sequence", ctypes.c_uint)]


class _ScreenIter(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("rem", ctypes.c_int), ("index", ctypes.c_int)]


class _Screen(ctypes.Structure):
    _fields_ = [
        ("root", ctypes.c_uint32),
        ("default_colormap", ctypes.c_uint32),
        ("white_pixel", ctypes.c_uint32),
        ("black_pixel", ctypes.c_uint32),
        ("current_input_masks", ctypes.c_uint32),
        ("width_in_pixels", ctypes.c_uint16),
        ("height_in_pixels", ctypes.c_uint16),
        ("width_in_mm", ctypes.c_uint16),
        ("height_in_mm", ctypes.c_uint16),
        ("min_installed_maps", ctypes.c_uint16),
        ("max_installed_maps", ctypes.c_uint16),
        ("root_visual", ctypes.c_uint32),
        ("backing_stores", ctypes.c_uint8),
        ("save_unders", ctypes.c_uint8),
        ("root_depth", ctypes.c_uint8),
        ("allowed_depths_len", ctypes.c_uint8),
    ]


class _AtomReply(ctypes.Structure):
    _fields_ = [("response_type", ctypes.c_uint8), ("pad0", ctypes.c_uint8), ("sequence", ctypes.c_uint16),
                ("length", ctypes.c_uint32), ("atom", ctypes.c_uint32)]


class _GenericError(ctypes.Structure):
    _fields_ = [("response_type", ctypes.c_uint8), ("error_code", ctypes.c_uint8), ("sequence", ctypes.c_uint16)]


_lib: ctypes.CDLL | None = None
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.free.argtypes = [ctypes.c_void_p]


def available() -> str | None:
    """None when libxcb can be loaded, else what is missing."""
    try:
        _xcb()
    except OSError as e:
        return f"libxcb not loadable ({e}): apt-get install libxcb1"
    return None


def _xcb() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(ctypes.util.find_library("xcb") or "libxcb.so.1")
    vp, u8, u16, u32, i16 = ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int16
    perr = ctypes.POINTER(ctypes.POINTER(_GenericError))
    sig: dict[str, tuple[object, list[object]]] = {
        "xcb_connect_to_fd": (vp, [ctypes.c_int, vp]),
        "xcb_connection_has_error": (ctypes.c_int, [vp]),
        "xcb_disconnect": (None, [vp]),
        "xcb_flush": (ctypes.c_int, [vp]),
        "xcb_get_setup": (vp, [vp]),
        "xcb_setup_roots_iterator": (_ScreenIter, [vp]),
        "xcb_get_image": (_Cookie, [vp, u8, u32, i16, i16, u16, u16, u32]),
        "xcb_get_image_reply": (vp, [vp, _Cookie, perr]),
        "xcb_get_image_data": (vp, [vp]),
        "xcb_get_image_data_length": (ctypes.c_int, [vp]),
        "xcb_intern_atom": (_Cookie, [vp, u8, u16, ctypes.c_char_p]),
        "xcb_intern_atom_reply": (ctypes.POINTER(_AtomReply), [vp, _Cookie, perr]),
        "xcb_get_property": (_Cookie, [vp, u8, u32, u32, u32, u32, u32]),
        "xcb_get_property_reply": (vp, [vp, _Cookie, perr]),
        "xcb_get_property_value": (vp, [vp]),
        "xcb_get_property_value_length": (ctypes.c_int, [vp]),
        "xcb_set_screen_saver_checked": (_Cookie, [vp, i16, i16, u8, u8]),
        "xcb_force_screen_saver_checked": (_Cookie, [vp, u8]),
        "xcb_request_check": (ctypes.POINTER(_GenericError), [vp, _Cookie]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


@dataclass(frozen=True)
class Grab:
    """One screenshot: RGB pixels (height x width x 3, uint8) and the focused window's title."""

    rgb: np.ndarray
    title: str


class XClient:
    """One connection, opened by ``with``; each method is one short round trip."""

    def __init__(self, socket_dir: str, display: int, timeout: float) -> None:
        self.socket_dir = socket_dir
        self.display = display
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._conn: int | None = None
        self.root = 0
        self.width = 0
        self.height = 0
        self._atoms: dict[str, int] = {}

    # -- connection ----------------------------------------------------------------------------
    def __enter__(self) -> XClient:
        lib = _xcb()
        dirfd = os.open(self.socket_dir, os.O_PATH | os.O_DIRECTORY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(f"/proc/self/fd/{dirfd}/X{self.display}")
        except OSError as e:
            sock.close()
            raise XError(f"cannot connect to X socket {self.socket_dir}/X{self.display}: {e}") from None
        finally:
            os.close(dirfd)
        sock.settimeout(None)
        self._sock = sock
        fd = os.dup(sock.fileno())  # libxcb owns and closes this one; ``sock`` stays for shutdown
        late: list[int] = []
        try:
            conn = self._bounded(lambda: lib.xcb_connect_to_fd(fd, None), "connection setup", late)
        except XTimeout:
            for c in late:  # the setup ended after the deadline: release what libxcb made
                lib.xcb_disconnect(c)
            self._close_sock()
            raise
        if not conn or lib.xcb_connection_has_error(conn):
            if conn:
                lib.xcb_disconnect(conn)
            self._close_sock()
            raise XError(f"X server at {self.socket_dir}/X{self.display} refused the connection")
        self._conn = conn
        it = lib.xcb_setup_roots_iterator(lib.xcb_get_setup(conn))
        screen = ctypes.cast(it.data, ctypes.POINTER(_Screen)).contents
        self.root, self.width, self.height = screen.root, screen.width_in_pixels, screen.height_in_pixels
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            _xcb().xcb_disconnect(self._conn)
            self._conn = None
        self._close_sock()

    def _close_sock(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _bounded(self, fn: Callable[[], T], what: str, late: list[T] | None = None) -> T:
        """Run a blocking libxcb call; past the deadline shut the socket so that it returns.

        On a timeout, a value the call still returned after the shutdown is put in ``late``.
        """
        box: list[T] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                box.append(fn())
            except BaseException as e:  # pragma: no cover - ctypes calls do not raise
                error.append(e)

        t = threading.Thread(target=target, daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
            t.join(2.0)
            if late is not None and box:
                late.append(box[0])
            raise XTimeout(f"X server did not answer {what} within {self.timeout:g} s")
        if error:
            raise error[0]
        return box[0]

    @property
    def conn(self) -> int:
        if self._conn is None:
            raise XError("not connected")
        if _xcb().xcb_connection_has_error(self._conn):
            raise XError("X connection broke")
        return self._conn

    # -- requests ------------------------------------------------------------------------------
    def atom(self, name: str) -> int:
        if name in self._atoms:
            return self._atoms[name]
        lib, conn = _xcb(), self.conn
        raw = name.encode()
        cookie = lib.xcb_intern_atom(conn, 0, len(raw), raw)
        reply = self._bounded(lambda: lib.xcb_intern_atom_reply(conn, cookie, None), "InternAtom")
        if not reply:
            raise XError(f"InternAtom {name} failed")
        value = int(reply.contents.atom)
        _libc.free(ctypes.cast(reply, ctypes.c_void_p))
        self._atoms[name] = value
        return value

    def get_property(self, window: int, prop: str, kind: int = 0, length: int = 4096) -> bytes:
        lib, conn = _xcb(), self.conn
        cookie = lib.xcb_get_property(conn, 0, window, self.atom(prop), kind, 0, length)
        reply = self._bounded(lambda: lib.xcb_get_property_reply(conn, cookie, None), "GetProperty")
        if not reply:
            return b""
        try:
            n = lib.xcb_get_property_value_length(reply)
            return ctypes.string_at(lib.xcb_get_property_value(reply), n) if n > 0 else b""
        finally:
            _libc.free(reply)

    def active_window(self) -> int:
        data = self.get_property(self.root, "_NET_ACTIVE_WINDOW", 0, 1)
        return int.from_bytes(data[:4], "little") if len(data) >= 4 else 0

    def window_title(self, window: int) -> str:
        if not window:
            return ""
        data = self.get_property(window, "_NET_WM_NAME", 0)
        if not data:
            data = self.get_property(window, "WM_NAME", 0)
        return data.decode("utf-8", errors="replace")

    def active_title(self) -> str:
        return self.window_title(self.active_window())

    def grab_rgb(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> np.ndarray:
        """RGB pixels of the screen, or of the rectangle given."""
        lib, conn = _xcb(), self.conn
        w = self.width - x if width is None else width
        h = self.height - y if height is None else height
        cookie = lib.xcb_get_image(conn, 2, self.root, x, y, w, h, 0xFFFFFFFF)  # ZPixmap
        err = ctypes.POINTER(_GenericError)()
        reply = self._bounded(lambda: lib.xcb_get_image_reply(conn, cookie, ctypes.byref(err)), "GetImage")
        if not reply:
            code = err.contents.error_code if err else "?"
            if err:
                _libc.free(ctypes.cast(err, ctypes.c_void_p))
            raise XError(f"GetImage failed (X error {code})")
        try:
            n = lib.xcb_get_image_data_length(reply)
            raw = ctypes.string_at(lib.xcb_get_image_data(reply), n)
        finally:
            _libc.free(reply)
        if n != w * h * 4:
            raise XError(f"GetImage returned {n} bytes for {w}x{h}: not a 24/32-bit screen")
        bgrx = np.frombuffer(raw, dtype=np.uint8).reshape(h, w, 4)
        return np.ascontiguousarray(bgrx[:, :, 2::-1])

    def grab(self) -> Grab:
        return Grab(self.grab_rgb(), self.active_title())

    def blank_screen(self) -> None:
        """Blank the screen for real: the server's screen saver, forced on.

        Xvfb has no hardware blanking (it would pretend and draw nothing), so blanking is not
        preferred and exposures are allowed: the server maps its screen-saver window over the whole
        screen, painted with the root's black background.
        """
        lib, conn = _xcb(), self.conn
        for cookie in (lib.xcb_set_screen_saver_checked(conn, 0, 0, 0, 1),  # DontPreferBlanking, AllowExposures
                       lib.xcb_force_screen_saver_checked(conn, 1)):  # ScreenSaverActive
            def check(c: _Cookie = cookie) -> Any:
                return lib.xcb_request_check(conn, c)

            err = self._bounded(check, "screen saver")
            if err:
                code = err.contents.error_code
                _libc.free(ctypes.cast(err, ctypes.c_void_p))
                raise XError(f"screen saver request failed (X error {code})")


def grab(socket_dir: str, display: int, timeout: float) -> Grab:
    with XClient(socket_dir, display, timeout) as x:
        return x.grab()


def encode_png(rgb: np.ndarray, level: int = 1) -> bytes:
    """PNG bytes of an RGB array (filter 0 on every row, zlib ``level``): no imaging library needed."""
    import struct
    import zlib

    h, w, _ = rgb.shape
    rows = np.empty((h, w * 3 + 1), dtype=np.uint8)
    rows[:, 0] = 0
    rows[:, 1:] = rgb.reshape(h, w * 3)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), level))
            + chunk(b"IEND", b""))


def decode_png(data: bytes) -> np.ndarray:
    """RGB array of a PNG made by ``encode_png`` (8-bit RGB, every row filter 0)."""
    import struct
    import zlib

    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            if (depth, color) != (8, 2):
                raise ValueError("only 8-bit RGB PNGs")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * 3 + 1)
    if rows[:, 0].any():
        raise ValueError("only filter-0 rows")
    return rows[:, 1:].reshape(height, width, 3).copy()
