"""The FastAPI application of ``drumsbench serve``, built on OpenEnv's ``HTTPEnvServer``.

OpenEnv provides the routes (``/reset`` ``/step`` ``/state`` ``/health`` ``/metadata`` ``/schema``
``POST /mcp`` and the ``/ws`` session), the wire envelope and the per-session capacity. DrumsBench
adds: the idle reaper (``reaper.py``), ``503 at capacity`` for stateless HTTP resets, ``422`` for
reset arguments of the wrong type (``session.ResetArgs``), a token gate for binds other than
loopback, an origin gate for loopback binds (``LoopbackOnly``: a web page in the user's browser
cannot drive a session) and ``GET /drumsbench/status`` (live sessions and sandboxes).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hmac
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.websockets import WebSocketDisconnect
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import ConcurrencyConfig, WSErrorCode, WSErrorResponse
from starlette.websockets import WebSocketDisconnected

from drumsbench.serve.hub import AtCapacity, Hub
from drumsbench.serve.reaper import reap_idle
from drumsbench.serve.session import BadRequest, ServedEnv
from drumsbench.serve.wire import DrumsObservation, action_class

LOOPBACK = ("127.0.0.1", "localhost", "::1")


# The hang-up of the WebSocket connection being served in this task (set by ``QuietDisconnect``):
# a session made while serving it is tied to it, and reaping the session hangs it up.
_HANGUP: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("drumsbench_hangup", default=None)


class DrumsHTTPServer(HTTPEnvServer):
    """OpenEnv's server with DrumsBench's idle reaper in place of its own; a reaped session's
    WebSocket is closed by the server (a client that is alive but silent no longer holds a socket)."""

    def __init__(self, hub: Hub) -> None:
        super().__init__(functools.partial(ServedEnv, hub), action_class(hub.suite.actions), DrumsObservation,
                         concurrency_config=ConcurrencyConfig(max_concurrent_envs=hub.cfg.max_sessions,
                                                              session_timeout=hub.cfg.idle_s))
        self.hub = hub
        self.hangups: dict[str, asyncio.Event] = {}

    async def _create_session(self) -> tuple[str, Any]:
        session_id, env = await super()._create_session()
        hangup = _HANGUP.get()
        if hangup is not None:
            self.hangups[session_id] = hangup
        return session_id, env

    async def _destroy_session(self, session_id: str) -> None:
        try:
            await super()._destroy_session(session_id)
        finally:
            hangup = self.hangups.pop(session_id, None)
            if hangup is not None:
                hangup.set()

    async def _reap_idle_sessions(self) -> None:
        def count() -> None:
            self.hub.reaped += 1

        await reap_idle(self, self.hub.cfg.idle_s, count)


async def refuse(scope: dict[str, Any], receive: Any, send: Any, status: int, detail: str,
                 ws_reason: str | None = None) -> None:
    """Answer a request a gate refuses: HTTP ``status`` with ``{"detail": detail}``, or a WebSocket
    closed with 1008 before it is accepted (the client sees the handshake refused)."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008, "reason": (ws_reason or detail)[:120]})
        return
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


class TokenGate:
    """ASGI middleware: with a token, every request needs ``Authorization: Bearer TOKEN`` or the path
    prefix ``/t/TOKEN`` (for clients that cannot send headers on a WebSocket: OpenEnv's own client
    takes ``base_url=http://HOST:PORT/t/TOKEN``)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token
        self.prefix = f"/t/{token}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path == self.prefix or path.startswith(self.prefix + "/"):
            rest = path[len(self.prefix):] or "/"
            return await self.app({**scope, "path": rest, "raw_path": rest.encode()}, receive, send)
        auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode(errors="replace")
        scheme, _, given = auth.strip().partition(" ")  # the scheme is case-insensitive (RFC 7235)
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return await self.app(scope, receive, send)
        await refuse(scope, receive, send, 401, "token required: send Authorization: Bearer TOKEN",
                     ws_reason="token required")


def create_app(hub: Hub) -> FastAPI:
    app = FastAPI(title="DrumsBench", version="0.1.0",
                  description="DrumsBench environments as an OpenEnv service: the final observation carries "
                  "reward 1/0/null with outcome, cause and valid (never train on valid=false).")
    server = DrumsHTTPServer(hub)
    server.register_routes(app)

    @app.exception_handler(AtCapacity)
    async def at_capacity(_request: Request, exc: AtCapacity) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "1"})

    @app.exception_handler(BadRequest)
    async def bad_request(_request: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.get("/drumsbench/status", tags=["DrumsBench"])
    async def status() -> dict[str, object]:
        return {**hub.status(), "ws_sessions": server.active_sessions}

    app.state.drums_server = server
    return app


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def refused_message(message: dict[str, Any]) -> str | None:
    """Why a WebSocket message is answered with an error frame here instead of reaching OpenEnv's
    handler (which ends the connection on a message that is JSON but not an object), or None:
    a message must be a JSON object, without NaN or Infinity (Python's reader takes them; the
    ledger's JSON would not). Text that is not JSON at all is left to OpenEnv (its own error frame)."""
    if message.get("type") != "websocket.receive" or message.get("text") is None:
        return None
    text = message["text"]
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        return None
    except ValueError as e:
        return f"Invalid JSON: {e} (write a number, or null)"
    if not isinstance(value, dict):
        return f"Invalid message: a JSON object is expected, not a {type(value).__name__}"
    return None


class QuietDisconnect:
    """OpenEnv's ``/ws`` handler closes an already disconnected socket on its way out (a client that
    died), and answers a send that failed because the client left mid-step with another send; the
    ``WebSocketDisconnect`` / ``WebSocketDisconnected`` this raises is the expected end of that
    session, not an error to log (the latter only once a send did fail). The session was destroyed
    (and its attempt recorded) before.

    It also gives each WebSocket connection a hang-up (``_HANGUP``): when the connection's session is
    destroyed by the server (reaped), the handler's next wait for a message ends as a disconnect, so
    the handler closes the socket (close code 1000) instead of waiting for a client that is gone."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        hangup = asyncio.Event()
        token = _HANGUP.set(hangup)

        async def receive_one() -> Any:
            if hangup.is_set():
                return {"type": "websocket.disconnect", "code": 1000}
            message = asyncio.ensure_future(receive())
            hung_up = asyncio.ensure_future(hangup.wait())
            done, _ = await asyncio.wait({message, hung_up}, return_when=asyncio.FIRST_COMPLETED)
            if message in done:
                hung_up.cancel()
                return message.result()
            message.cancel()
            return {"type": "websocket.disconnect", "code": 1000}

        async def receive_or_hang_up() -> Any:
            while True:
                message = await receive_one()
                problem = refused_message(message)
                if problem is None:
                    return message
                await send({"type": "websocket.send", "text": WSErrorResponse(
                    data={"message": problem, "code": WSErrorCode.INVALID_JSON}).model_dump_json()})

        gone = False

        async def send_or_note(message: Any) -> None:
            nonlocal gone
            try:
                await send(message)
            except Exception:
                gone = True  # the client is gone (uvicorn's ClientDisconnected, a reset connection)
                raise

        try:
            with contextlib.suppress(WebSocketDisconnect):
                await self.app(scope, receive_or_hang_up, send_or_note)
        except WebSocketDisconnected:
            # OpenEnv answers a failed send (the client left mid-step, no close frame) with another
            # send, which Starlette refuses: the expected end of a session whose client is gone
            if not gone:
                raise
        finally:
            _HANGUP.reset(token)


class LoopbackOnly:
    """ASGI middleware of a loopback bind: a request's ``Host`` must name loopback (127.0.0.1,
    localhost, ::1) and its ``Origin``, when sent, must be a loopback origin on the server's own port
    or one of ``allowed`` (``--allow-origin``). A web page open in the user's browser sends its own
    origin (cross-site WebSocket hijacking) or, after DNS rebinding, its own host name: either is
    refused (HTTP 403; a WebSocket closed with 1008 before it is accepted). Clients that are not
    browsers send no Origin and a loopback Host, and pass."""

    def __init__(self, app: Any, port: int, allowed: Iterable[str] = ()) -> None:
        self.app, self.port = app, port
        self.allowed = {o.rstrip("/").lower() for o in allowed}

    def problem(self, headers: dict[bytes, bytes]) -> str | None:
        host = headers.get(b"host", b"").decode(errors="replace").lower()
        name = urlsplit(f"//{host}").hostname if host else None
        if name not in LOOPBACK:
            return f"Host {host!r} is not this machine's loopback"
        origin = headers.get(b"origin")
        if origin is None:
            return None
        text = origin.decode(errors="replace").rstrip("/").lower()
        if text in self.allowed:
            return None
        try:
            o = urlsplit(text)
            port = o.port or {"http": 80, "https": 443}.get(o.scheme)
        except ValueError:
            return f"Origin {text!r} is not a URL"
        if o.scheme in ("http", "https") and o.hostname in LOOPBACK and port == self.port:
            return None
        return f"Origin {text!r} is not this server (allow it with --allow-origin)"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        why = self.problem(dict(scope.get("headers") or []))
        if why is None:
            return await self.app(scope, receive, send)
        await refuse(scope, receive, send, 403, why)


def wrap(app: FastAPI, token: str | None, port: int | None = None, allowed: Iterable[str] = ()) -> Any:
    """The served application with its gates: the token's (when given) and, with ``port`` (a
    loopback bind's), the origin gate."""
    quiet: Any = QuietDisconnect(app)
    if port is not None:
        quiet = LoopbackOnly(quiet, port, allowed)
    return TokenGate(quiet, token) if token else quiet
