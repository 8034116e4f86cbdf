"""Is an X server's screen saver on? Asked over the X protocol itself (MIT-SCREEN-SAVER
``QueryInfo``), with the standard library only: the harness asks a host instance's server in
process, a guest's server runs this file under the guest's Python (``python3 -I saver.py DIR DISPLAY``
prints the state).

Why it is evidence (docs/attribution.md, the desktop): a blank frame while the X server answers and
LibreOffice runs is the policy's doing (a minimised or covered window) unless the server says its
screen saver is on — a state no key, click or typed text changes (Xvfb's own timer is off, so only
an X client forcing it can: the harness's fault injector, or code of the policy's that holds the X
socket, which a GUI-only policy does not run).

Contract: ``state(socket_dir, display, timeout)`` returns ``"on"``, ``"off"`` or ``"disabled"`` (no timer and not
forced), or raises ``OSError`` (no server, no extension, no answer within ``timeout`` seconds).
"""

from __future__ import annotations

import os
import socket
import struct
import sys

_QUERY_EXTENSION = 98
_SAVER_QUERY_INFO = 1
STATES = {0: "off", 1: "on", 3: "disabled"}


def _pad(n: int) -> int:
    return (4 - n % 4) % 4


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise OSError("the X server closed the connection")
        data += part
    return data


def _reply(sock: socket.socket) -> bytes:
    """The next reply (events skipped; an X error raises)."""
    while True:
        head = _read(sock, 32)
        if head[0] == 0:
            raise OSError(f"X error {head[1]}")
        if head[0] == 1:
            extra = struct.unpack_from("<I", head, 4)[0]
            return head + _read(sock, 4 * extra)


def state(socket_dir: str, display: int, timeout: float) -> str:
    """The screen saver's state of the X server listening on ``socket_dir/X<display>`` (reached
    through the folder's descriptor: a sandbox's path may be longer than a socket address holds)."""
    dirfd = os.open(socket_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(f"/proc/self/fd/{dirfd}/X{display}")
            return _ask(sock)
    finally:
        os.close(dirfd)


def _ask(sock: socket.socket) -> str:
    """The X handshake on ``sock``, then QueryExtension and the screen saver's QueryInfo."""
    sock.sendall(struct.pack("<BxHHHHxx", ord("l"), 11, 0, 0, 0))  # little-endian, no authorisation
    head = _read(sock, 8)
    if head[0] != 1:
        raise OSError(f"the X server refused the connection (setup status {head[0]})")
    body = _read(sock, 4 * struct.unpack_from("<H", head, 6)[0])
    vendor_len, = struct.unpack_from("<H", body, 16)
    formats = body[21]
    root, = struct.unpack_from("<I", body, 32 + vendor_len + _pad(vendor_len) + 8 * formats)
    name = b"MIT-SCREEN-SAVER"
    sock.sendall(struct.pack("<BxHHxx", _QUERY_EXTENSION, 2 + (len(name) + _pad(len(name))) // 4, len(name))
                 + name + b"\0" * _pad(len(name)))
    ext = _reply(sock)
    if not ext[8]:
        raise OSError("the X server has no MIT-SCREEN-SAVER extension")
    sock.sendall(struct.pack("<BBHI", ext[9], _SAVER_QUERY_INFO, 2, root))
    info = _reply(sock)
    if info[1] not in STATES:
        raise OSError(f"the X server said screen saver state {info[1]}")
    return STATES[info[1]]


if __name__ == "__main__":
    try:
        print(state(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 5.0))
    except OSError as e:
        sys.exit(f"saver: {e}")
