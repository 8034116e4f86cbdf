"""Hostile clients of ``drumsbench serve`` — for the service's test and benchmark only.

Each client in ``CLIENTS`` takes the server's base URL (``http://127.0.0.1:PORT``) and a number,
does one hostile thing, checks the answer the server owes it (``AssertionError`` otherwise) and
returns the ``client`` name of the episode it started (whose attempt must reach the ledger), or
None when it started none:

- ``bad_http``: ``POST /reset`` with a number for ``policy``: 422;
- ``bad_ws_then_drop``: over WebSocket a negative seed and a JSON array (an error frame each), then
  a good reset, a ``sleep 10`` shell step and the socket closed mid-step without a close frame;
- ``fifo``: a shell step that makes FIFOs in the work, home and tmp folders, then submit: the
  episode ends failed;
- ``web_page``: a WebSocket handshake with a foreign ``Origin``: refused.

``HealthPoller`` asks ``/health`` every ``every_s`` while hostile clients run and keeps each
answer's latency (ms); ``open_fds`` counts a process's descriptors.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


def bad_http(url: str, i: int) -> str | None:
    r = httpx.post(f"{url}/reset", content='{"policy": 5}', headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 422, r.text
    return None


def bad_ws_then_drop(url: str, i: int) -> str | None:
    name = f"hostile-drop-{i}"
    # the closing handshake that leaving the block attempts fails on the dropped socket: expected
    with contextlib.suppress(OSError, ConnectionClosed), connect(_ws(url), open_timeout=30, close_timeout=1) as ws:
        ws.send('{"type": "reset", "data": {"seed": -1}}')
        assert json.loads(ws.recv(timeout=60))["type"] == "error"
        ws.send("[1, 2]")
        assert json.loads(ws.recv(timeout=60))["type"] == "error"
        ws.send(json.dumps({"type": "reset", "data": {"client": name}}))
        assert json.loads(ws.recv(timeout=60))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"kind": "shell", "command": "sleep 10"}}))
        ws.socket.close()  # gone mid-step, no close frame
    return name


def fifo(url: str, i: int) -> str | None:
    name = f"hostile-fifo-{i}"
    with connect(_ws(url), open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"client": name}}))
        obs = json.loads(ws.recv(timeout=60))["data"]["observation"]
        last: dict = {}
        for step in ({"kind": "shell", "command": 'mkfifo f "$TMPDIR/f" "$HOME/f"; ls -l'}, {"kind": "submit"}):
            ws.send(json.dumps({"type": "step", "data": {**step, "generation": obs["generation"]}}))
            last = json.loads(ws.recv(timeout=120))
            obs = last["data"]["observation"]
    assert last["data"]["done"] is True and obs["outcome"] == "failed", last
    return name


def web_page(url: str, i: int) -> str | None:
    try:
        connect(_ws(url), origin=Origin("http://evil.example"), open_timeout=30)
    except InvalidStatus as e:
        assert e.response.status_code == 403
        return None
    raise AssertionError("a WebSocket from a foreign origin was accepted")


CLIENTS: dict[str, Callable[[str, int], str | None]] = {
    "bad_http": bad_http, "bad_ws_then_drop": bad_ws_then_drop, "fifo": fifo, "web_page": web_page}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class HealthPoller:
    """``with HealthPoller(url) as p:`` asks ``/health`` every ``every_s`` in a thread (one kept-alive
    connection) until the block ends; ``p.latencies_ms``; a non-200 answer or an error is kept in
    ``p.errors``."""

    def __init__(self, url: str, every_s: float = 0.02) -> None:
        self.url = url
        self.every_s = every_s
        self.latencies_ms: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-poller", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as c:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    code = c.get(f"{self.url}/health").status_code
                except httpx.HTTPError as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                else:
                    self.latencies_ms.append(1000 * (time.monotonic() - t0))
                    if code != 200:
                        self.errors.append(f"status {code}")
                self._stop.wait(self.every_s)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(30)
