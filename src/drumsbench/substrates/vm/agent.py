"""The channel to the guest agent (``agent.c``, the guest's init): JSON lines over virtio-serial."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

from drumsbench.core.errors import SubstrateError


class AgentError(Exception):
    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class Channel:
    """JSON lines to and from the guest agent over one socket; calls may run concurrently."""

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.sock = sock
        self.label = label
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._next = 0
        self.closed: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"vm-agent-{label}")
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        why = "the guest agent closed its channel (the VM exited)"
        try:
            while True:
                chunk = self.sock.recv(1 << 18)
                if not chunk:
                    break
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1:]
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    with self._lock:
                        waiter = self._pending.pop(msg.get("id"), None)
                    if waiter is not None:
                        waiter[1].append(msg)
                        waiter[0].set()
        except OSError as e:
            why = f"the guest agent's channel failed: {e}"
        with self._lock:
            self.closed = self.closed or why
            waiters, self._pending = list(self._pending.values()), {}
        for event, _ in waiters:
            event.set()

    def call(self, op: str, wait: float, **args: Any) -> dict[str, Any]:
        """The agent's answer; ``AgentError`` when it answered with an error, ``SubstrateError``
        when it did not answer at all."""
        event: threading.Event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            if self.closed:
                raise SubstrateError(f"vm {self.label}: {self.closed}")
            self._next += 1
            rid = self._next
            self._pending[rid] = (event, box)
        data = (json.dumps({"id": rid, "op": op, **args}, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as e:
            with self._lock:
                self._pending.pop(rid, None)
            raise SubstrateError(f"vm {self.label}: cannot reach the guest agent: {e}") from e
        if not event.wait(wait):
            with self._lock:
                self._pending.pop(rid, None)
            raise SubstrateError(f"vm {self.label}: the guest agent did not answer {op!r} within {wait:g} s")
        if not box:
            raise SubstrateError(f"vm {self.label}: {self.closed or 'no answer'}")
        msg = box[0]
        if not msg.get("ok"):
            raise AgentError(str(msg.get("error")), msg.get("errno"))
        return msg

    def close(self) -> None:
        with self._lock:
            self.closed = self.closed or "closed by the host"
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
