"""A short-lived X client from the harness side, through libxcb with ctypes (no Xlib, no mss).

Why not ``DISPLAY``: each desktop instance's X socket lives in the sandbox's own
``tmp/.X11-unix`` folder (bound over ``/tmp/.X11-unix`` inside the instance's mount namespace), and
the instance's network namespace hides the abstract socket. Xlib cannot be pointed at an arbitrary
socket path, so the harness connects a plain Unix socket to the path itself — through
``/proc/self/fd/<dirfd>/X<n>``, which keeps the path short of the 108-byte limit whatever the
sandbox's location — and hands the connected fd to ``xcb_connect_to_fd``.

Every operation opens a connection, does its work and closes it: no connection from the harness
stays open between calls (a checkpoint of the instance must not see an outside client; a settle
wait keeps one for its own duration, and its shared-memory segment goes with it). A server that
does not answer (stopped, wedged) is detected by a deadline: replies are awaited by polling the
socket (``XClient._reply``, no thread); the connection setup runs in a thread whose socket is shut
down past the deadline. Either way ``XTimeout`` is raised.

For the settle wait (``settle.py``): ``watch`` (DAMAGE events for all drawing, the root's window
and property events), ``ping`` / ``events`` (EWMH ``_NET_WM_PING`` and its answer), ``snapshot``
(active window, title, focus in one round trip) and ``grab_view`` (the screen through MIT-SHM
1.2: a memfd passed to the server). The DAMAGE and MIT-SHM requests are sent raw with
``xcb_send_request`` (no libxcb-damage here).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import select
import socket
import struct
import threading
import time
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


class _ExtensionReply(ctypes.Structure):
    _fields_ = [("response_type", ctypes.c_uint8), ("pad0", ctypes.c_uint8), ("sequence", ctypes.c_uint16),
                ("length", ctypes.c_uint32), ("present", ctypes.c_uint8), ("major_opcode", ctypes.c_uint8),
                ("first_event", ctypes.c_uint8), ("first_error", ctypes.c_uint8)]


class _ProtocolRequest(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("ext", ctypes.c_void_p), ("opcode", ctypes.c_uint8),
                ("isvoid", ctypes.c_uint8)]


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _FocusReply(ctypes.Structure):
    _fields_ = [("response_type", ctypes.c_uint8), ("revert_to", ctypes.c_uint8), ("sequence", ctypes.c_uint16),
                ("length", ctypes.c_uint32), ("focus", ctypes.c_uint32)]


# No libxcb-damage on these hosts: the DAMAGE extension's two requests are sent raw through
# ``xcb_send_request`` with the major opcode from QueryExtension (protocol: damageproto 1.1).
_DAMAGE_NAME = b"DAMAGE"
_SHM_NAME = b"MIT-SHM"
_SHM_QUERY_VERSION, _SHM_GET_IMAGE, _SHM_ATTACH_FD = 0, 4, 6
_DAMAGE_QUERY_VERSION, _DAMAGE_CREATE = 0, 1
_DAMAGE_REPORT_RAW_RECTANGLES = 0
_REQUEST_CHECKED = 1
# core protocol numbers used below
_CW_EVENT_MASK = 1 << 11
_SUBSTRUCTURE_NOTIFY_MASK, _PROPERTY_CHANGE_MASK = 1 << 19, 1 << 22
_PROPERTY_NOTIFY, _CLIENT_MESSAGE = 28, 33
# the root's substructure events (the window is at offset 8 in each)
_STRUCTURE_EVENTS = {16: "create", 17: "destroy", 18: "unmap", 19: "map", 21: "reparent", 22: "configure"}


_lib: ctypes.CDLL | None = None
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.restype = ctypes.c_int


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
        "xcb_get_image_data": (vp, [vp]),
        "xcb_get_image_data_length": (ctypes.c_int, [vp]),
        "xcb_intern_atom": (_Cookie, [vp, u8, u16, ctypes.c_char_p]),
        "xcb_get_property": (_Cookie, [vp, u8, u32, u32, u32, u32, u32]),
        "xcb_get_property_value": (vp, [vp]),
        "xcb_get_property_value_length": (ctypes.c_int, [vp]),
        "xcb_set_screen_saver_checked": (_Cookie, [vp, i16, i16, u8, u8]),
        "xcb_force_screen_saver_checked": (_Cookie, [vp, u8]),
        "xcb_request_check": (ctypes.POINTER(_GenericError), [vp, _Cookie]),
        "xcb_send_request": (ctypes.c_uint, [vp, ctypes.c_int, ctypes.POINTER(_IOVec),
                                             ctypes.POINTER(_ProtocolRequest)]),
        "xcb_send_request_with_fds": (ctypes.c_uint, [vp, ctypes.c_int, ctypes.POINTER(_IOVec),
                                                      ctypes.POINTER(_ProtocolRequest), ctypes.c_uint,
                                                      ctypes.POINTER(ctypes.c_int)]),
        "xcb_poll_for_reply": (ctypes.c_int, [vp, ctypes.c_uint, ctypes.POINTER(vp), perr]),
        "xcb_get_file_descriptor": (ctypes.c_int, [vp]),
        "xcb_query_extension": (_Cookie, [vp, u16, ctypes.c_char_p]),
        "xcb_generate_id": (u32, [vp]),
        "xcb_change_window_attributes_checked": (_Cookie, [vp, u32, u32, vp]),
        "xcb_send_event": (_Cookie, [vp, u8, u32, u32, ctypes.c_char_p]),
        "xcb_poll_for_event": (vp, [vp]),
        "xcb_get_input_focus": (_Cookie, [vp]),
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
        self._damage_event = -1  # the DAMAGE extension's first event code, once ``watch()`` ran
        self._pending: list[XEvent] = []
        self._answers_ping: dict[int, bool] = {}
        self._shm: mmap.mmap | None = None  # two screens' worth of memory shared with the server (MIT-SHM)
        self._shm_seg = 0
        self._shm_major = 0
        self._shm_error = ""  # why shared-memory grabs are not available ("" before trying)

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
            _xcb().xcb_disconnect(self._conn)  # the server detaches the shared segment
            self._conn = None
        self._close_sock()
        if self._shm is not None:
            with contextlib.suppress(BufferError):  # a view still held (an exception's frame): freed later
                self._shm.close()
            self._shm = None

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
    def _reply(self, seq: int, what: str) -> tuple[int | None, int | None]:
        """Wait for the reply to request ``seq``: (a pointer the caller frees with ``_libc.free``,
        None) or (None, the X error code). No thread: the socket is polled until ``self.timeout``,
        then ``XTimeout`` (a stopped or wedged server)."""
        lib, conn = _xcb(), self.conn
        lib.xcb_flush(conn)
        deadline = time.monotonic() + self.timeout
        reply, err = ctypes.c_void_p(), ctypes.POINTER(_GenericError)()
        waiter: select.poll | None = None
        while not lib.xcb_poll_for_reply(conn, seq, ctypes.byref(reply), ctypes.byref(err)):
            left = deadline - time.monotonic()
            if left <= 0:
                raise XTimeout(f"X server did not answer {what} within {self.timeout:g} s")
            if waiter is None:
                waiter = select.poll()
                waiter.register(lib.xcb_get_file_descriptor(conn), select.POLLIN)
            waiter.poll(max(1, int(left * 1000)))
        if err:
            code = int(err.contents.error_code)
            _libc.free(ctypes.cast(err, ctypes.c_void_p))
            return None, code
        if not reply.value:
            raise XError(f"X connection broke waiting for {what}")
        return reply.value, None

    def atoms(self, *names: str) -> list[int]:
        """The atoms of ``names`` (interned in one round trip, then cached)."""
        lib, conn = _xcb(), self.conn
        asked = {}
        for name in dict.fromkeys(names):
            if name not in self._atoms:
                raw = name.encode()
                asked[name] = lib.xcb_intern_atom(conn, 0, len(raw), raw).sequence
        for name, seq in asked.items():
            reply, code = self._reply(seq, "InternAtom")
            if reply is None:
                raise XError(f"InternAtom {name} failed (X error {code})")
            self._atoms[name] = int(ctypes.cast(reply, ctypes.POINTER(_AtomReply)).contents.atom)
            _libc.free(reply)
        return [self._atoms[n] for n in names]

    def atom(self, name: str) -> int:
        return self.atoms(name)[0]

    def _ask_property(self, window: int, prop: str, kind: int = 0, length: int = 4096) -> int:
        return int(_xcb().xcb_get_property(self.conn, 0, window, self.atom(prop), kind, 0, length).sequence)

    def _property_value(self, seq: int) -> bytes:
        """The value of a property asked with ``_ask_property``; b"" when unset or the window is gone."""
        lib = _xcb()
        reply, _code = self._reply(seq, "GetProperty")
        if reply is None:
            return b""
        try:
            n = lib.xcb_get_property_value_length(reply)
            return ctypes.string_at(lib.xcb_get_property_value(reply), n) if n > 0 else b""
        finally:
            _libc.free(reply)

    def get_property(self, window: int, prop: str, kind: int = 0, length: int = 4096) -> bytes:
        return self._property_value(self._ask_property(window, prop, kind, length))

    def active_window(self) -> int:
        data = self.get_property(self.root, "_NET_ACTIVE_WINDOW", 0, 1)
        return int.from_bytes(data[:4], "little") if len(data) >= 4 else 0

    def window_title(self, window: int) -> str:
        if not window:
            return ""
        self.atoms("_NET_WM_NAME", "WM_NAME")
        net, plain = self._ask_property(window, "_NET_WM_NAME"), self._ask_property(window, "WM_NAME")
        data, fallback = self._property_value(net), self._property_value(plain)
        return (data or fallback).decode("utf-8", errors="replace")

    def active_title(self) -> str:
        return self.window_title(self.active_window())

    def grab_rgb(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> np.ndarray:
        """RGB pixels of the screen, or of the rectangle given."""
        w = self.width - x if width is None else width
        h = self.height - y if height is None else height
        return bgrx_to_rgb(self.grab_raw(x, y, w, h), w, h)

    def grab_raw(self, x: int = 0, y: int = 0, width: int | None = None, height: int | None = None) -> bytes:
        """The screen's (or the rectangle's) pixels as the server sends them: 4 bytes a pixel, BGRX."""
        lib, conn = _xcb(), self.conn
        w = self.width - x if width is None else width
        h = self.height - y if height is None else height
        cookie = lib.xcb_get_image(conn, 2, self.root, x, y, w, h, 0xFFFFFFFF)  # ZPixmap
        reply, code = self._reply(cookie.sequence, "GetImage")
        if reply is None:
            raise XError(f"GetImage failed (X error {code})")
        try:
            n = lib.xcb_get_image_data_length(reply)
            raw = ctypes.string_at(lib.xcb_get_image_data(reply), n)
        finally:
            _libc.free(reply)
        if n != w * h * 4:
            raise XError(f"GetImage returned {n} bytes for {w}x{h}: not a 24/32-bit screen")
        return raw

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


    # -- screenshots through shared memory (MIT-SHM 1.2: a memfd handed to the server) ------------
    def grab_view(self, slot: int) -> np.ndarray:
        """The whole screen's pixels (BGRX, flat uint8) in buffer ``slot`` (0 or 1): written by the
        server straight into memory shared with it (no copy through the socket) when MIT-SHM 1.2 is
        there, else a socket grab. The view is valid until the next grab into the same slot and
        while the connection is open: convert (``bgrx_to_rgb``) what must outlive it."""
        size = self.width * self.height * 4
        if self._shm is None and not self._shm_error:
            try:
                self._attach_shm(2 * size)
            except XTimeout:
                raise
            except (XError, OSError) as e:
                self._shm_error = str(e) or type(e).__name__
        if self._shm is None:
            return np.frombuffer(self.grab_raw(), dtype=np.uint8)
        body = struct.pack("=IhhHHIB3xII", self.root, 0, 0, self.width, self.height, 0xFFFFFFFF, 2, self._shm_seg,
                           slot * size)
        seq = self._send_raw(self._shm_major, _SHM_GET_IMAGE, body, void=False)
        reply, code = self._reply(seq, "ShmGetImage")
        if reply is None:
            raise XError(f"ShmGetImage failed (X error {code})")
        _libc.free(reply)
        return np.frombuffer(self._shm, dtype=np.uint8, count=size, offset=slot * size)

    def _attach_shm(self, size: int) -> None:
        lib, conn = _xcb(), self.conn
        name = _SHM_NAME
        reply, code = self._reply(lib.xcb_query_extension(conn, len(name), name).sequence, "QueryExtension")
        if reply is None:
            raise XError(f"QueryExtension failed (X error {code})")
        ext = ctypes.cast(reply, ctypes.POINTER(_ExtensionReply)).contents
        present, major = ext.present, int(ext.major_opcode)
        _libc.free(reply)
        if not present:
            raise XError("no MIT-SHM extension")
        reply, code = self._reply(self._send_raw(major, _SHM_QUERY_VERSION, b"", void=False), "ShmQueryVersion")
        if reply is None:
            raise XError(f"ShmQueryVersion failed (X error {code})")
        v_major, v_minor = struct.unpack_from("=HH", ctypes.string_at(reply, 12), 8)
        _libc.free(reply)
        if (v_major, v_minor) < (1, 2):
            raise XError(f"MIT-SHM {v_major}.{v_minor} cannot take a file descriptor (1.2 needed)")
        fd = os.memfd_create("drumsbench-grab", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            shm = mmap.mmap(fd, size)
            seg = int(lib.xcb_generate_id(conn))
            sent = os.dup(fd)  # libxcb closes the descriptors it sends
            seq = self._send_raw(major, _SHM_ATTACH_FD, struct.pack("=IB3x", seg, 0), void=True, fds=[sent])
        finally:
            os.close(fd)
        reply, code = self._reply(lib.xcb_get_input_focus(conn).sequence, "sync")
        if reply is not None:
            _libc.free(reply)
        err = lib.xcb_request_check(conn, _Cookie(seq))
        if err or reply is None:
            if err:
                code = err.contents.error_code
                _libc.free(ctypes.cast(err, ctypes.c_void_p))
            shm.close()
            raise XError(f"ShmAttachFd failed (X error {code})")
        self._shm, self._shm_seg, self._shm_major = shm, seg, major

    # -- evidence that the screen and the application are done -------------------------------------
    def input_focus(self) -> int:
        """The window holding the keyboard focus (GetInputFocus)."""
        reply, code = self._reply(_xcb().xcb_get_input_focus(self.conn).sequence, "GetInputFocus")
        if reply is None:
            raise XError(f"GetInputFocus failed (X error {code})")
        value = int(ctypes.cast(reply, ctypes.POINTER(_FocusReply)).contents.focus)
        _libc.free(reply)
        return value

    def snapshot(self, hint: int = 0) -> tuple[int, str, int]:
        """(the active window, its title, the focus window): one round trip when the active window
        is ``hint`` (its title is asked at once), two otherwise."""
        lib, conn = _xcb(), self.conn
        self.atoms("_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "WM_NAME")
        active_seq = self._ask_property(self.root, "_NET_ACTIVE_WINDOW", 0, 1)
        focus_seq = lib.xcb_get_input_focus(conn).sequence
        titles = (self._ask_property(hint, "_NET_WM_NAME"), self._ask_property(hint, "WM_NAME")) if hint else None
        data = self._property_value(active_seq)
        active = int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
        focus_reply, _code = self._reply(focus_seq, "GetInputFocus")
        focus = 0
        if focus_reply is not None:
            focus = int(ctypes.cast(focus_reply, ctypes.POINTER(_FocusReply)).contents.focus)
            _libc.free(focus_reply)
        if titles is not None:
            net, plain = (self._property_value(seq) for seq in titles)
            if active == hint:
                return active, (net or plain).decode("utf-8", errors="replace"), focus
        return active, self.window_title(active), focus

    def watch(self) -> None:
        """From now on receive, as ``XEvent``s from ``events()``: every drawing anywhere on the
        screen (a DAMAGE object on the root window reporting raw rectangles), the root's
        substructure changes (windows mapped, unmapped, moved) and property changes (the active
        window), and the answers to ``ping``. What was drawn before is not reported (the server's
        initial report of the whole screen is dropped). Everything is released when the connection
        closes. ``XError`` when the server has no DAMAGE extension or refuses a request."""
        lib, conn = _xcb(), self.conn
        name = _DAMAGE_NAME
        ext_seq = lib.xcb_query_extension(conn, len(name), name).sequence
        self.atoms("WM_PROTOCOLS", "_NET_WM_PING", "_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "WM_NAME")
        reply, code = self._reply(ext_seq, "QueryExtension")
        if reply is None:
            raise XError(f"QueryExtension failed (X error {code})")
        ext = ctypes.cast(reply, ctypes.POINTER(_ExtensionReply)).contents
        present, major, first_event = ext.present, int(ext.major_opcode), int(ext.first_event)
        _libc.free(reply)
        if not present:
            raise XError("the X server has no DAMAGE extension")
        self._damage_event = first_event
        version = self._send_raw(major, _DAMAGE_QUERY_VERSION, struct.pack("=II", 1, 1), void=False)
        damage = int(lib.xcb_generate_id(conn))
        create = self._send_raw(major, _DAMAGE_CREATE, struct.pack("=IIB3x", damage, self.root,
                                                                  _DAMAGE_REPORT_RAW_RECTANGLES), void=True)
        mask = (ctypes.c_uint32 * 1)(_SUBSTRUCTURE_NOTIFY_MASK | _PROPERTY_CHANGE_MASK)
        select_seq = lib.xcb_change_window_attributes_checked(conn, self.root, _CW_EVENT_MASK, mask).sequence
        for seq, what in ((version, "DamageQueryVersion"), (lib.xcb_get_input_focus(conn).sequence, "sync")):
            reply, code = self._reply(seq, what)
            if reply is None:
                raise XError(f"{what} failed (X error {code})")
            _libc.free(reply)
        # both checked requests are answered by now (a later reply came): no round trip here
        for seq, what in ((create, "DamageCreate"), (select_seq, "ChangeWindowAttributes")):
            err = lib.xcb_request_check(conn, _Cookie(seq))
            if err:
                code = err.contents.error_code
                _libc.free(ctypes.cast(err, ctypes.c_void_p))
                raise XError(f"{what} failed (X error {code})")
        self._drain()  # the creation's report of the whole screen, and anything before it

    def _send_raw(self, major: int, minor: int, body: bytes, void: bool, fds: list[int] | None = None) -> int:
        """Send an extension request (``body`` after the 4-byte header; libxcb writes the major
        opcode and the length, the minor opcode is ours), with ``fds`` (which libxcb closes): its
        sequence number."""
        lib, conn = _xcb(), self.conn
        data = ctypes.create_string_buffer(bytes([0, minor, 0, 0]) + body, 4 + len(body))
        vec = (_IOVec * 3)()  # libxcb needs two free entries before the first one it sends
        vec[2].iov_base, vec[2].iov_len = ctypes.addressof(data), len(data)
        req = _ProtocolRequest(1, None, major, 1 if void else 0)
        first = ctypes.cast(ctypes.byref(vec, 2 * ctypes.sizeof(_IOVec)), ctypes.POINTER(_IOVec))
        flags = _REQUEST_CHECKED if void else 0
        if fds:
            seq = int(lib.xcb_send_request_with_fds(conn, flags, first, ctypes.byref(req), len(fds),
                                                    (ctypes.c_int * len(fds))(*fds)))
        else:
            seq = int(lib.xcb_send_request(conn, flags, first, ctypes.byref(req)))
        if seq == 0:
            raise XError("X connection broke while sending a request")
        return seq

    def window_pid(self, window: int) -> int:
        """``_NET_WM_PID`` of ``window`` (as its client's pid namespace numbers it), 0 when unset."""
        data = self.get_property(window, "_NET_WM_PID", 6, 1) if window else b""  # 6: CARDINAL
        return int.from_bytes(data[:4], "little") if len(data) >= 4 else 0

    def answers_ping(self, window: int) -> bool:
        """Does ``window`` (a top-level client window) list ``_NET_WM_PING`` in its WM_PROTOCOLS?
        (Asked once per window and connection.)"""
        if not window:
            return False
        if window not in self._answers_ping:
            data = self.get_property(window, "WM_PROTOCOLS", 4, 64)  # 4: ATOM
            atoms = struct.unpack(f"={len(data) // 4}I", data[:len(data) // 4 * 4])
            self._answers_ping[window] = self.atom("_NET_WM_PING") in atoms
        return self._answers_ping[window]

    def ping(self, window: int, token: int) -> None:
        """Send the EWMH ping (``_NET_WM_PING``, ``token`` as its timestamp) to ``window``'s client.

        The client answers by sending the message back to the root window from its event loop: the
        answer comes only once it has read every event queued for it before the ping (the input of an
        action included) and dispatched them. ``watch()`` first, to receive the answer."""
        lib, conn = _xcb(), self.conn
        event = struct.pack("=BBHII5I", _CLIENT_MESSAGE, 32, 0, window, self.atom("WM_PROTOCOLS"),
                            self.atom("_NET_WM_PING"), token & 0xFFFFFFFF, window, 0, 0)
        lib.xcb_send_event(conn, 0, window, 0, event)
        lib.xcb_flush(conn)

    def events(self, timeout: float) -> list[XEvent]:
        """The events received so far (``watch()``), waiting up to ``timeout`` seconds for one when
        none is there. ``XError`` when the connection broke."""
        out, self._pending = self._pending + self._drain(), []
        if not out and timeout > 0 and self._sock is not None:
            waiter = select.poll()
            waiter.register(self._sock.fileno(), select.POLLIN)
            if waiter.poll(max(1, int(timeout * 1000))):
                out = self._drain()
        if _xcb().xcb_connection_has_error(self.conn):
            raise XError("X connection broke")
        return out

    def unread(self, events: list[XEvent]) -> None:
        """Put ``events`` back: the next ``events()`` returns them first."""
        self._pending = list(events) + self._pending

    def _drain(self) -> list[XEvent]:
        lib, conn = _xcb(), self.conn
        out: list[XEvent] = []
        now = time.monotonic()
        while True:
            ptr = lib.xcb_poll_for_event(conn)
            if not ptr:
                return out
            raw = ctypes.string_at(ptr, 32)
            _libc.free(ptr)
            out.append(self._parse(raw, now))

    def _parse(self, raw: bytes, t: float) -> XEvent:
        code = raw[0] & 0x7F
        if code == self._damage_event:
            x, y, w, h = struct.unpack_from("=hhHH", raw, 16)
            return XEvent("damage", t, area=(x, y, w, h))
        if code == _CLIENT_MESSAGE:
            window, kind, l0, l1, l2 = struct.unpack_from("=IIIII", raw, 4)
            if kind == self._atoms.get("WM_PROTOCOLS") and l0 == self._atoms.get("_NET_WM_PING"):
                return XEvent("pong", t, window=l2, value=l1)
            return XEvent("message", t, window=window, value=kind)
        if code == _PROPERTY_NOTIFY:
            window, atom = struct.unpack_from("=II", raw, 4)
            return XEvent("property", t, window=window, value=atom)
        if code in _STRUCTURE_EVENTS:
            (window,) = struct.unpack_from("=I", raw, 8)
            return XEvent(_STRUCTURE_EVENTS[code], t, window=window)
        if code == 0:
            return XEvent("error", t, value=raw[1])
        return XEvent("other", t, value=code)


@dataclass(frozen=True)
class XEvent:
    """One event of a ``watch``: ``kind`` is damage (``area`` drawn: x, y, width, height), pong (a
    ping's answer: ``value`` its token, ``window`` the client window), create / destroy / map /
    unmap / reparent / configure (a window of the root's, ``window``), property (``window``,
    ``value`` the atom), message, error (``value`` the code) or other (``value`` the event code);
    ``t`` is when it was read (monotonic)."""

    kind: str
    t: float
    window: int = 0
    value: int = 0
    area: tuple[int, int, int, int] = (0, 0, 0, 0)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Are two contiguous arrays byte for byte equal (memcmp: no temporary array)?"""
    if a.nbytes != b.nbytes or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return int(_libc.memcmp(a.ctypes.data, b.ctypes.data, a.nbytes)) == 0


def bgrx_to_rgb(raw: bytes | np.ndarray, width: int, height: int) -> np.ndarray:
    """RGB array (height x width x 3) of ``grab_raw`` bytes. One long strided copy per channel: about
    six times faster than copying the reversed three-byte view (whose inner loop is 3 long)."""
    bgrx = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 4)
    rgb = np.empty((bgrx.shape[0], 3), dtype=np.uint8)
    rgb[:, 0], rgb[:, 1], rgb[:, 2] = bgrx[:, 2], bgrx[:, 1], bgrx[:, 0]
    return rgb.reshape(height, width, 3)


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
