"""The idle reaper: a session that waited longer than the idle limit for its client is closed.

OpenEnv's own reaper (``HTTPEnvServer._reap_idle_sessions``) measures idleness from the last
answer it sent, so a long step (a verifier run) looks idle, and it wakes at most every 5 s. This
one asks each session how long it has waited for its client (0 while a request is answered) and
wakes every quarter of a second, so an abandoned sandbox is destroyed within the idle limit plus
one tick. Closing goes through OpenEnv's ``_destroy_session``: the session's slot in the server's
capacity is freed, and the session's ``close`` records the unfinished attempt as
``invalid/policy_unavailable`` (``extra.reaped``, ``extra.idle_s``) and destroys its sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from drumsbench.serve.session import ServedEnv

TICK_S = 0.25


async def reap_idle(server: Any, idle_s: float, on_reap: Any = None) -> None:
    """Run until cancelled. ``server`` is OpenEnv's ``HTTPEnvServer`` (its sessions and lock)."""
    tick = min(TICK_S, idle_s / 4)
    while True:
        try:
            await asyncio.sleep(tick)
            async with server._session_lock:
                items = list(server._sessions.items())
            for sid, env in items:
                if isinstance(env, ServedEnv) and env.idle_for() > idle_s:
                    env.mark_reaped(env.idle_for())
                    if on_reap is not None:
                        on_reap()
                    await server._destroy_session(sid)
        except asyncio.CancelledError:
            break
        except Exception as exc:  # keep reaping; say why one pass failed
            logging.getLogger(__name__).warning("drumsbench reaper: %s", exc)
