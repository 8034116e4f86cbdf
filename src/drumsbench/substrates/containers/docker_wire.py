"""The Docker exec API's wire, as the ``docker`` substrate reads it: the multiplexed frames of a
hijacked exec socket (8-byte headers: stream, size), what ``http.client`` buffered past the upgrade,
a ``Stream`` relaying such a socket to two pipes, and a file object over an archive's chunks.

Nothing here talks to the daemon: the substrate passes the sockets and, for a stream, how to ask
the exec's status and how to kill what it started.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.exec_core import HeadTail, PipeStream

HEADER = struct.Struct(">BxxxL")


def posixpath_join(path: str, target: str) -> str:
    return target if target.startswith("/") else posixpath.join(posixpath.dirname(path), target)


class ChunkReader(io.RawIOBase):
    """A file object over the SDK's chunk iterator (for ``tarfile`` in stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def buffered_stream_bytes(sock: Any, raw: socket.socket) -> bytes:
    """The start of the exec's stream that ``http.client`` already read past the ``101 UPGRADED``
    headers into its buffer. The SDK hands out the socket *under* that buffer, so without this a
    command whose output arrives before the client parsed the headers (a busy client: other
    threads hold the GIL) loses it whole: it exits 0 with empty output."""
    try:
        fp = sock._response.raw._fp.fp
    except AttributeError:
        return b""
    if fp is None:
        return b""
    raw.setblocking(False)  # peek: what is buffered, or one read that does not wait
    try:
        data = fp.peek(1 << 16)
        return fp.read(len(data)) if data else b""
    except (OSError, ValueError):
        return b""


def take_frames(pending: bytearray) -> Iterator[tuple[int, bytes]]:
    """(stream, payload) of each whole frame at the start of ``pending`` (removed from it); stream 2
    is stderr, 1 stdout."""
    while len(pending) >= HEADER.size:
        kind, size = HEADER.unpack_from(pending)
        if len(pending) < HEADER.size + size:
            return
        payload = bytes(pending[HEADER.size : HEADER.size + size])
        del pending[: HEADER.size + size]
        yield kind, payload


class DockerStream(PipeStream):
    """A ``Stream`` over an exec's hijacked socket: two daemon threads relay it to pipes. One demuxes
    the frames, stdout into the stdout pipe (stderr dropped) until the exec's stream ends; the other
    sends what the stdin pipe gives to the socket, and half-closes the socket's write side when the
    caller closes its stdin end. Each thread closes its own pipe end when it is done."""

    def __init__(self, eid: str, sock: Any, raw: socket.socket, early: bytes, status: Callable[[], int | None],
                 kill: Callable[[], None]) -> None:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        super().__init__(in_w, out_r)
        self._sock = sock
        self._raw = raw
        self._ask_status = status
        self._kill_inside = kill
        self._threads = [
            threading.Thread(target=self._relay_out, args=(early, out_w), name=f"stream-out-{eid[:8]}", daemon=True),
            threading.Thread(target=self._relay_in, args=(in_r,), name=f"stream-in-{eid[:8]}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _relay_out(self, early: bytes, out_w: int) -> None:
        pending = bytearray(early)
        try:
            while True:
                for kind, payload in take_frames(pending):
                    if kind != 2:
                        write_all(out_w, payload)
                chunk = self._raw.recv(1 << 16)
                if not chunk:
                    return
                pending += chunk
        except OSError:  # the socket shut (``close``), or the caller closed its read end
            return
        finally:
            os.close(out_w)

    def _relay_in(self, in_r: int) -> None:
        poller = select.poll()
        poller.register(in_r, select.POLLIN)
        poller.register(self._raw, select.POLLRDHUP)  # the exec's stream ended: stop reading stdin
        try:
            while True:
                for fd, _ in poller.poll():
                    if fd != in_r:
                        return
                    data = os.read(in_r, 1 << 16)
                    if not data:
                        self._raw.shutdown(socket.SHUT_WR)
                        return
                    self._raw.sendall(data)
        except OSError:
            return
        finally:
            os.close(in_r)

    def _status(self) -> int | None:
        return self._ask_status()

    def _kill(self, timeout: float) -> None:
        with contextlib.suppress(SubstrateError):
            self._kill_inside()

    def _reap(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            self._sock.close()
        while True:
            code = self._status()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.01)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_frames(
    raw: socket.socket, deadline: float, limit: int, early: bytes = b""
) -> tuple[bytes, bytes, list[int], bool]:
    """Read Docker's multiplexed stream to EOF or ``deadline``; keep ``limit`` bytes per stream
    (head and tail, as ``hostproc.HeadTail``). ``early``: the stream's first bytes, read already."""
    keep = [HeadTail(limit), HeadTail(limit)]
    pending = bytearray()
    raw.setblocking(False)
    poller = select.poll()  # not select(): descriptors above 1024 are common at high concurrency
    poller.register(raw, select.POLLIN)
    try:
        chunk = early
        while True:
            if chunk:
                pending += chunk
                for kind, payload in take_frames(pending):
                    keep[1 if kind == 2 else 0].add(payload)
                chunk = b""
            wait = deadline - time.monotonic()
            if wait <= 0:
                return keep[0].value(), keep[1].value(), [keep[0].total, keep[1].total], True
            if not poller.poll(max(1, int(wait * 1000))):
                continue
            try:
                chunk = raw.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return keep[0].value(), keep[1].value(), [keep[0].total, keep[1].total], False
    finally:
        with contextlib.suppress(OSError):
            raw.setblocking(True)
