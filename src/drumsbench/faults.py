"""Fault injection: make each gate fire on purpose, by really causing the fault.

``--inject cause=rate,...`` gives each invalid cause a probability per attempt. An attempt gets at
most one fault, drawn deterministically from the run's seed and the attempt's sequence number
(so a resumed run injects the same faults). Each fault acts on the real system:

| cause | what is done |
|---|---|
| dirty_reset | a stray file is written into the work folder after the reset, before the fingerprint check |
| stale_generation | an action of the previous generation is replayed into the environment |
| step_timeout | an action that hangs (``sleep``) is sent |
| episode_timeout | actions that each fit the step timeout are sent until the episode deadline passes |
| bad_observation | the environment's observation channel is broken for the first observation |
| verifier_unavailable | the staged verifier is corrupted so that it crashes when run |
| contamination | a live neighbour's canary is written into the sandbox |
| substrate_failure | the sandbox is destroyed behind the rollout's back |
| policy_unavailable | the policy call goes to an inference endpoint that refuses connections |
"""

from __future__ import annotations

import hashlib
import socket

from pydantic import BaseModel

from drumsbench.errors import PolicyUnavailable, UsageError
from drumsbench.outcome import InvalidCause


class FaultPlan(BaseModel, frozen=True):
    rates: dict[InvalidCause, float] = {}
    seed: int = 0

    @classmethod
    def parse(cls, text: str | None, seed: int = 0) -> FaultPlan:
        """Parse ``cause=rate,...``; ``UsageError`` naming the bad part and the fix."""
        rates: dict[InvalidCause, float] = {}
        for part in (text or "").split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep:
                raise UsageError(f"--inject: {part!r} has no '='; write cause=rate, e.g. stale_generation=0.05")
            try:
                cause = InvalidCause(name.strip())
            except ValueError:
                raise UsageError(f"--inject: unknown cause {name.strip()!r}; choose from "
                                 f"{', '.join(c.value for c in InvalidCause)}") from None
            try:
                rate = float(value)
            except ValueError:
                raise UsageError(f"--inject: rate {value!r} for {cause} is not a number; give 0 to 1") from None
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"--inject: rate {rate} for {cause} is outside 0..1")
            rates[cause] = rate
        if sum(rates.values()) > 1.0 + 1e-9:
            raise UsageError(f"--inject: rates add up to {sum(rates.values()):.3f}; "
                             "an attempt gets at most one fault, keep the sum <= 1")
        return cls(rates=rates, seed=seed)

    def draw(self, seq: int) -> InvalidCause | None:
        """The fault for attempt ``seq`` (or None); the same for the same seed and seq."""
        if not self.rates:
            return None
        h = hashlib.sha256(f"{self.seed}:{seq}".encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        acc = 0.0
        for cause in InvalidCause:
            acc += self.rates.get(cause, 0.0)
            if u < acc:
                return cause
        return None

    def spec(self) -> str:
        return ",".join(f"{c.value}={r:g}" for c, r in self.rates.items())


def unreachable_endpoint() -> None:
    """Call an inference endpoint that refuses connections: a loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as e:
        raise PolicyUnavailable(f"inference endpoint 127.0.0.1:{port} unreachable: {e}") from e
    raise PolicyUnavailable(f"inference endpoint 127.0.0.1:{port} answered unexpectedly")
