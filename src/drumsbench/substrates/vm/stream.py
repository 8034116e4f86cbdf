"""The vm substrate's streams (``Streaming.open_stream``): a command in the guest whose stdin and
stdout the harness holds as OS pipes.

The guest agent starts the command (``sopen``: the exec's uid, environment, token and session, its
stderr discarded) and holds its pipes; on the host two pump threads carry the bytes between the
harness's pipes and the agent's requests, ``swrite`` (stdin) and ``sread`` (stdout, a long poll of
``READ_WAIT_S``). Both count bytes from the stream's start, so a request the host gave up on (the
VM stopped from the host for longer than the answer's wait) is repeated without a byte lost or
doubled. ``close`` is the agent's ``sclose``: the command's session and every process with its
token killed, its status awaited. The guest's ``reset`` and ``end_processes`` kill a stream's
command as any other: its stdout reaches EOF."""

from __future__ import annotations

import base64
import contextlib
import os
import threading
from typing import Any, Protocol

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.exec_core import PipeStream
from drumsbench.substrates.vm.agent import AgentError

READ_WAIT_S = 1.0  # how long one ``sread`` waits in the guest for output
ANSWER_SLACK_S = 30.0  # beyond the guest's own wait, before the host asks again
CHUNK = 1 << 16


class AgentCalls(Protocol):
    """The agent channel's ``call`` and whether it is closed (``agent.Channel``)."""

    closed: str | None

    def call(self, op: str, wait: float, **args: Any) -> dict[str, Any]: ...


class AgentStream(PipeStream):
    """A command the guest agent started with ``sopen`` (stream ``sid``)."""

    def __init__(self, agent: AgentCalls, sid: int, label: str) -> None:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        super().__init__(in_w, out_r)
        self._agent = agent
        self._sid = sid
        self._stop = threading.Event()
        self._close_code: int | None = None
        self._pumps = [
            threading.Thread(target=self._pump_in, args=(in_r,), name=f"vm-stream-in-{label}-{sid}", daemon=True),
            threading.Thread(target=self._pump_out, args=(out_w,), name=f"vm-stream-out-{label}-{sid}", daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _request(self, op: str, wait: float, **args: Any) -> dict[str, Any] | None:
        """The agent's answer; asked again while the channel is open and the stream not closed (a
        stopped VM answers late); None once either ended or the agent refused."""
        while not self._stop.is_set() and self._agent.closed is None:
            try:
                return self._agent.call(op, wait + ANSWER_SLACK_S, sid=self._sid, **args)
            except AgentError:
                return None  # the stream is gone in the guest (closed, or a reset of the whole guest)
            except SubstrateError:
                continue  # no answer in time: the byte counts make a repeat safe
        return None

    def _pump_in(self, fd: int) -> None:
        """The harness's writes to ``stdin_fd`` -> ``swrite``; its close -> stdin closed in the guest."""
        at = 0
        try:
            while True:
                data = os.read(fd, CHUNK)
                if self._stop.is_set():
                    return
                answer = self._request("swrite", 5.0, at=at, data=base64.b64encode(data).decode(), close=not data)
                if answer is None or not data:
                    return
                at += len(data)
        except OSError:
            return
        finally:
            os.close(fd)  # later writes of the harness: BrokenPipeError

    def _pump_out(self, fd: int) -> None:
        """``sread`` -> the pipe the harness reads (``stdout_fd``); EOF when the guest's pipe ends."""
        at = 0
        try:
            while True:
                answer = self._request("sread", READ_WAIT_S, at=at, hold=READ_WAIT_S)
                if answer is None:
                    return
                data = base64.b64decode(answer["data"])
                base = int(answer["at"])
                data = data[max(0, at - base):]
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                at = max(at, base) + len(data)
                if answer.get("eof"):
                    return
        except (OSError, ValueError, KeyError):
            return  # the harness closed its end, or a malformed answer: the stream ends
        finally:
            os.close(fd)

    def _status(self) -> int | None:
        with contextlib.suppress(AgentError, SubstrateError):
            code = self._agent.call("spoll", ANSWER_SLACK_S, sid=self._sid).get("code")
            return None if code is None else int(code)
        return None

    def _kill(self, timeout: float) -> None:
        self._stop.set()
        with contextlib.suppress(AgentError, SubstrateError):
            code = self._agent.call("sclose", timeout + ANSWER_SLACK_S, sid=self._sid, timeout=timeout).get("code")
            self._close_code = None if code is None else int(code)

    def _reap(self, timeout: float) -> int | None:
        for pump in self._pumps:
            pump.join(max(0.0, min(timeout, 2.0)))
        return self._close_code
