"""The verifier's channel to the harness: lines the code under test cannot forge.

Contract: the harness makes a fresh secret per verification and hands it to the verifier runner on
stdin (never argv, env or a file). The runner prints ``DRUMSBENCH_READY <mac>`` once it can run the
checks, and exactly one ``DRUMSBENCH_VERDICT <mac> <json>``; ``mac`` is HMAC-SHA256(secret, text).
The harness accepts only lines whose MAC checks out: anything else on any stream is ignored.

The runner's side is ``core/verdict_lines.py``, one copy for every runner: runners that run
standalone in a sandbox are shipped as ``runner_source(path)``, their import of ``verdict_lines``
replaced by that module's text.
"""

from __future__ import annotations

import hmac
import json
import secrets
from pathlib import Path

from drumsbench.core import verdict_lines
from drumsbench.core.verdict_lines import VERDICT_WORD, mac

__all__ = ["authentic_verdict", "mac", "new_secret", "runner_source", "saw_ready"]

# the line a standalone runner imports the runner's side with; replaced when the runner is shipped
RUNNER_IMPORT = "from drumsbench.core.verdict_lines import "


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def saw_ready(lines: list[str], secret: bytes) -> bool:
    """Did the runner print its authenticated ready line?"""
    return verdict_lines.ready_line(secret) in lines


def authentic_verdict(lines: list[str], secret: bytes) -> dict[str, object] | None:
    """The first verdict line whose MAC checks out, parsed; None when there is none."""
    for line in lines:
        if not line.startswith(VERDICT_WORD + " "):
            continue
        parts = line.split(" ", 2)
        if len(parts) == 3 and hmac.compare_digest(parts[1], mac(secret, parts[2])):
            try:
                verdict = json.loads(parts[2])
            except ValueError:
                return None
            return verdict if isinstance(verdict, dict) else None
    return None


def runner_source(path: Path) -> bytes:
    """The text of the standalone runner at ``path`` as shipped: its one line importing from
    ``drumsbench.core.verdict_lines`` replaced by that module's text, so the shipped runner imports
    nothing of drumsbench. A runner without that line (or with two) is a programming error."""
    lines = path.read_text().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(RUNNER_IMPORT)]
    if len(at) != 1:
        raise ValueError(f"{path}: expected one line starting {RUNNER_IMPORT!r}, found {len(at)}")
    own = Path(verdict_lines.__file__).read_text()
    if not own.endswith("\n"):
        own += "\n"
    return "".join([*lines[:at[0]], own, *lines[at[0] + 1:]]).encode()

