"""``drumsbench serve``: the environments as an OpenEnv-compatible service (docs/serve.md)."""

from __future__ import annotations

import os
import signal
import socket
from typing import Annotated

import typer
from pydantic import ValidationError

from drumsbench.cli import options as o
from drumsbench.cli.common import console, err, parse_duration, rollout_config, usage_error
from drumsbench.core.errors import UsageError


class _Stopped(Exception):
    pass


def listening_socket(host: str) -> socket.socket:
    """An unbound TCP socket for ``host`` (SO_REUSEADDR). Its proto is IPPROTO_TCP, not 0: asyncio
    sets TCP_NODELAY only on accepted sockets whose proto says TCP; without it every answer
    (headers, then body: two writes) waited ~40 ms for the client's delayed ACK (Nagle) — /health
    took 44 ms for a Python client instead of ~2.5 (``benchmarks/serve_hostile.py``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _stop(_sig: int, _frame: object) -> None:
    raise _Stopped()


def serve(
    substrate: o.Substrate = "process",
    tasks: o.Tasks = "coding",
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: a free one, printed at start).")] = 8000,
    token: Annotated[str | None, typer.Option(help="Required of clients (Bearer header or /t/TOKEN path); "
                                              "default $DRUMSBENCH_TOKEN.")] = None,
    max_sessions: Annotated[int, typer.Option(help="Live sessions (each holds one sandbox) at most.")] = 8,
    idle: Annotated[str, typer.Option(help="A session waiting this long for its client is reaped.")] = "60s",
    step_timeout: o.StepTimeout = "30s",
    episode_timeout: o.EpisodeTimeout = "300s",
    verify_timeout: o.VerifyTimeout = "task",
    seed: Annotated[int, typer.Option("--seed", help="Seed of attempts whose reset gives none.")] = 0,
    allow_origin: Annotated[list[str] | None, typer.Option(
        help="On a loopback bind, a browser origin (e.g. http://127.0.0.1:3000) allowed besides the "
        "server's own; repeatable.")] = None,
    out: o.Out = o.RUNS,
) -> None:
    """Serve the environments over HTTP and WebSocket (OpenEnv); every attempt goes to the ledger."""
    try:
        import uvicorn

        from drumsbench.serve.app import LOOPBACK, create_app, wrap
        from drumsbench.serve.hub import Hub, ServeConfig
    except ImportError as e:
        raise UsageError(f"serve: needs the serve extra (pip install 'drumsbench[serve]'): {e}") from None
    token = token or os.environ.get("DRUMSBENCH_TOKEN") or None
    if host not in LOOPBACK and not token:
        raise UsageError(f"--host: binding {host} exposes sandboxes beyond this machine; give --token "
                         "(or DRUMSBENCH_TOKEN), or bind 127.0.0.1")
    if token is not None and len(token) < 16:
        raise UsageError("--token: use at least 16 characters (e.g. `openssl rand -hex 16`)")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a port; give 0 to 65535")
    for origin in allow_origin or []:
        if not origin.startswith(("http://", "https://")) or "/" in origin.split("//", 1)[1].rstrip("/"):
            raise UsageError(f"--allow-origin: {origin!r} is not an origin; give SCHEME://HOST[:PORT], "
                             "e.g. http://127.0.0.1:3000")
    if max_sessions < 1:
        raise UsageError(f"--max-sessions: {max_sessions} must be at least 1")
    try:
        cfg = ServeConfig(substrate=substrate, tasks=tasks, max_sessions=max_sessions, seed=seed,
                          idle_s=parse_duration(idle, "--idle"),
                          rollout=rollout_config(step_timeout, episode_timeout, verify_timeout=verify_timeout))
    except ValidationError as e:
        raise usage_error(e) from None
    sock = listening_socket(host)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"--port: cannot bind {host}:{port} ({e.strerror}); give another port or 0") from None
    sock.listen(2048)  # clients that connect before uvicorn's loop runs wait in the backlog
    bound = sock.getsockname()[1]
    try:
        hub = Hub(cfg, out)  # validates --tasks (UsageError) before anything is created
        hub.start()
    except BaseException:
        sock.close()
        raise
    try:
        server = uvicorn.Server(uvicorn.Config(wrap(create_app(hub), token, bound if host in LOOPBACK else None,
                                                    allow_origin or ()), log_level="warning",
                                               ws_ping_interval=20, ws_ping_timeout=20,
                                               timeout_graceful_shutdown=10))
        url = f"http://{host}:{bound}" + (f"/t/{token}" if token else "")
        shown = url.replace(token, "<token>") if token else url
        print(f"drumsbench serve: {shown} run {hub.run_id} ({cfg.substrate}, {cfg.tasks}, "
              f"max {cfg.max_sessions} sessions, idle limit {cfg.idle_s:g} s), ledger {out}", flush=True)
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler
        # that was there before; this one turns it into a return, so the hub below still runs.
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.run(sockets=[sock])
        except _Stopped:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        hub.stop()
        sock.close()
    from drumsbench.experiments.run import ledger_path
    from drumsbench.ledger import Ledger
    from drumsbench.serve.clients import print_clients

    ledger = Ledger(ledger_path(out))
    try:
        err.print(f"served run {hub.run_id} stopped; `drumsbench report {hub.run_id} --out {out}` shows it")
        print_clients(ledger, hub.run_id, console)
    finally:
        ledger.close()
