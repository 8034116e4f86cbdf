"""The verifier's channel to the harness: lines the code under test cannot forge.

Contract: the harness makes a fresh secret per verification and hands it to the verifier runner on
stdin (never argv, env or a file). The runner prints ``DRUMSBENCH_READY <mac>`` (or the desktop
runner's ``DRUMSBENCH_VERIFIER_READY <mac>``) once it can run the checks, and exactly one
``DRUMSBENCH_VERDICT <mac> <json>``; ``mac`` is HMAC-SHA256(secret, text). The harness accepts only
lines whose MAC checks out: anything else on any stream is ignored. The runners carry their own
copy of the two lines of HMAC (they run standalone inside sandboxes).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def mac(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def saw_ready(lines: list[str], secret: bytes, word: str = "DRUMSBENCH_READY") -> bool:
    """Did the runner print its authenticated ready line?"""
    return f"{word} {mac(secret, 'ready')}" in lines


def authentic_verdict(lines: list[str], secret: bytes) -> dict[str, object] | None:
    """The first verdict line whose MAC checks out, parsed; None when there is none."""
    for line in lines:
        if not line.startswith("DRUMSBENCH_VERDICT "):
            continue
        parts = line.split(" ", 2)
        if len(parts) == 3 and hmac.compare_digest(parts[1], mac(secret, parts[2])):
            try:
                verdict = json.loads(parts[2])
            except ValueError:
                return None
            return verdict if isinstance(verdict, dict) else None
    return None
