"""The verifier's side of the verdict channel (``core/verdict_channel.py``): the two lines it prints.

Every verifier runner signs with these functions and nothing else: the coding kind's in-sandbox
runner (``envs/coding/verify_runner.py``), its trusted judge (``envs/coding/judge.py``) and the
desktop kind's UNO runner (``envs/desktop/verify_runner.py``). A runner that runs standalone in a
sandbox or guest cannot import ``drumsbench``: it is shipped as ``verdict_channel.runner_source``,
which puts this module's text where the runner's ``from drumsbench.core.verdict_lines import ...``
line stands. So this module is standard library only, has no ``from __future__`` line, and imports
inside its functions (a runner imports nothing more until it signs).

Lines: ``DRUMSBENCH_READY <mac>`` once the runner can run the checks, and exactly one
``DRUMSBENCH_VERDICT <mac> <json>``; ``mac`` is HMAC-SHA256(secret, text), hex.
"""

READY_WORD = "DRUMSBENCH_READY"
VERDICT_WORD = "DRUMSBENCH_VERDICT"


def mac(secret: bytes, text: str) -> str:
    """HMAC-SHA256 of ``text`` under the verification's secret, hex."""
    import hashlib
    import hmac

    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def ready_line(secret: bytes) -> str:
    """The line that says the runner can run the checks (no newline)."""
    return f"{READY_WORD} {mac(secret, 'ready')}"


def verdict_line(secret: bytes, text: str) -> str:
    """The verdict line for the JSON ``text`` (no newline)."""
    return f"{VERDICT_WORD} {mac(secret, text)} {text}"
