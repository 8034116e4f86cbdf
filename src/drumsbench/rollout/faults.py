"""Fault injection: make each gate fire on purpose, by really causing the fault where it happens.

``--inject cause=rate,...`` gives each invalid cause a probability per attempt. An attempt gets at
most one fault, drawn deterministically from the run's seed and the attempt's sequence number
(so a resumed run injects the same faults). The rollout calls its attempt's ``Injector`` at fixed
points (after the reset, before the first observation and each step, after staging the verifier,
after verifying) and knows nothing of what each one does; the gates never call an injector, and
no injector calls a gate. Each acts on the real system, at the infrastructure level:

| cause | what is done (by the host, outside the policy's reach) |
|---|---|
| dirty_reset | a stray file is written into the work folder after the reset, before the fingerprint check |
| stale_generation | an action of the previous generation is delivered to the environment (a stale queue) |
| step_timeout | the host freezes the sandbox (cgroup freezer, ``docker pause``, QEMU stop) before a step |
| episode_timeout | the transport stalls until the episode has less than half a step left, then the sandbox is frozen |
| bad_observation | the transport loses the end of the first observation's output (not marked truncated) |
| verifier_unavailable | the staged runner is damaged from the host before it runs (before any of the policy's code) |
| contamination | a live neighbour's canary is written into the sandbox from the host |
| substrate_failure | the sandbox is destroyed from outside before the verifier is staged |
| policy_unavailable | the policy's call goes through a real loopback inference endpoint that was stopped |

step_timeout and episode_timeout need a substrate whose sandboxes are ``Freezable``.
"""

from __future__ import annotations

import hashlib
import http.server
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from drumsbench.core.errors import PolicyUnavailable, UsageError
from drumsbench.core.outcome import InvalidCause
from drumsbench.envs.base import Action, ActionSpec, BreakableObservation, Environment, Observation, Task
from drumsbench.policies.scripted import Policy
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates.base import DEFAULT_OUTPUT_LIMIT, ExecResult, Freezable, Sandbox

NEEDS_FREEZE = (InvalidCause.STEP_TIMEOUT, InvalidCause.EPISODE_TIMEOUT)


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


class Injector:
    """One attempt's fault, applied at the rollout's fixed points. The base class injects nothing."""

    cause: InvalidCause | None = None

    def after_reset(self, env: Environment) -> None:
        """The reset is done; the fingerprint check comes next."""

    def before_observe(self, env: Environment) -> None:
        """The first observation comes next."""

    def after_observe(self, env: Environment) -> None:
        """The first observation was taken."""

    def before_step(self, env: Environment, deadline: float, step_timeout: float) -> None:
        """A policy's action comes next; ``deadline`` is the episode's (monotonic)."""

    def after_stage_verifier(self, env: Environment) -> None:
        """The verifier is staged and runs next."""

    def before_stage_verifier(self, env: Environment) -> None:
        """The policy submitted; the verifier is staged next."""

    def after_verify(self, env: Environment, token: str, canaries: CanaryRegistry) -> None:
        """The verifier ran; the isolation check comes next."""

    def after_attempt(self, canaries: CanaryRegistry) -> None:
        """The attempt has its outcome (its own canary is retired)."""

    def wrap_policy(self, policy: Policy) -> Policy:
        return policy


class _DirtyReset(Injector):
    def after_reset(self, env: Environment) -> None:
        box = env.box
        box.write_file(f"{box.paths.work}/.stray-from-earlier-attempt", b"left behind\n")


class _StaleGeneration(Injector):
    def __init__(self) -> None:
        self.done = False

    def before_step(self, env: Environment, deadline: float, step_timeout: float) -> None:
        if not self.done:
            self.done = True  # a queued action of the previous episode is delivered first
            env.step(Action("shell", env.generation - 1, {"command": "true"}), step_timeout)


class _Freeze(Injector):
    """Freeze the sandbox from the host before the first step (step_timeout) or, after stalling the
    transport, when less than half a step is left of the episode (episode_timeout)."""

    def __init__(self, cause: InvalidCause) -> None:
        self.cause = cause
        self.done = False

    def before_step(self, env: Environment, deadline: float, step_timeout: float) -> None:
        if self.done:
            return
        self.done = True
        box = env.box
        if not isinstance(box, Freezable):
            raise UsageError(f"--inject {self.cause}: {box.substrate} sandboxes cannot be frozen")
        if self.cause is InvalidCause.EPISODE_TIMEOUT:
            stall = deadline - time.monotonic() - 0.5 * step_timeout
            if stall > 0:
                time.sleep(stall)
        box.freeze()


class _LossyTransport(Sandbox):
    """The sandbox as seen through a transport that loses the end of each command's output."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner
        self.substrate, self.run_id, self.id, self.paths = inner.substrate, inner.run_id, inner.id, inner.paths

    def exec(self, command: str | Sequence[str], *, timeout: float, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None,
             output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        res = self.inner.exec(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin, output_limit=output_limit)
        kept = res.stdout[: len(res.stdout) // 2]
        return ExecResult(res.exit_code, kept, res.stderr, len(kept), res.stderr_total, res.timed_out,
                          res.duration_s)

    def write_file(self, path: str, data: bytes) -> None:
        self.inner.write_file(path, data)

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        return self.inner.read_file(path, limit)

    def end_processes(self) -> None:
        self.inner.end_processes()

    def destroy(self) -> None:
        self.inner.destroy()


class _BadObservation(Injector):
    def __init__(self) -> None:
        self.real: Sandbox | None = None

    def before_observe(self, env: Environment) -> None:
        if isinstance(env, BreakableObservation):
            env.break_observation_channel()
            return
        self.real = env.box
        env.attach(_LossyTransport(self.real))

    def after_observe(self, env: Environment) -> None:
        if self.real is not None:
            env.attach(self.real)


class _VerifierUnavailable(Injector):
    def after_stage_verifier(self, env: Environment) -> None:
        env.break_verifier()


class _Contamination(Injector):
    """A neighbour's canary written into the sandbox: one issued for it, live until the attempt has
    its outcome. (A live neighbour's own canary could retire between the write and the scan — the
    scan then rightly ignores it, and the injection would have tested nothing: 2 of 11 injections of
    a 200-attempt Harbor run went uncaught that way.)"""

    def __init__(self) -> None:
        self.decoy: str | None = None

    def after_verify(self, env: Environment, token: str, canaries: CanaryRegistry) -> None:
        box = env.box
        self.decoy = canaries.issue("decoy-neighbour")
        box.write_file(f"{box.paths.tmp}/from-neighbour", self.decoy.encode())

    def after_attempt(self, canaries: CanaryRegistry) -> None:
        if self.decoy is not None:
            canaries.retire(self.decoy)


class _SubstrateFailure(Injector):
    def before_stage_verifier(self, env: Environment) -> None:
        env.box.destroy()  # gone behind the rollout's back, as when a host reaps a container


class _UnavailablePolicy(Policy):
    """The policy behind a real loopback inference endpoint that was stopped."""

    def __init__(self, inner: Policy) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.url = stopped_endpoint()

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return self.inner.plan(task, rng)

    def begin(self, task: Task, rng: random.Random) -> None:
        self.inner.begin(task, rng)

    def act(self, obs: Observation) -> Action:
        try:
            urllib.request.urlopen(self.url, data=b"{}", timeout=2).close()
        except (urllib.error.URLError, OSError) as e:
            raise PolicyUnavailable(f"inference endpoint {self.url} unreachable: {e}") from e
        return self.inner.act(obs)


class _PolicyUnavailable(Injector):
    def wrap_policy(self, policy: Policy) -> Policy:
        return _UnavailablePolicy(policy)


def injector_for(cause: InvalidCause | None) -> Injector:
    """The injector of one attempt's fault (the base ``Injector`` when there is none)."""
    if cause is None:
        return Injector()
    made: Injector
    if cause is InvalidCause.DIRTY_RESET:
        made = _DirtyReset()
    elif cause is InvalidCause.STALE_GENERATION:
        made = _StaleGeneration()
    elif cause in NEEDS_FREEZE:
        made = _Freeze(cause)
    elif cause is InvalidCause.BAD_OBSERVATION:
        made = _BadObservation()
    elif cause is InvalidCause.VERIFIER_UNAVAILABLE:
        made = _VerifierUnavailable()
    elif cause is InvalidCause.CONTAMINATION:
        made = _Contamination()
    elif cause is InvalidCause.SUBSTRATE_FAILURE:
        made = _SubstrateFailure()
    else:
        made = _PolicyUnavailable()
    made.cause = cause
    return made


def stopped_endpoint() -> str:
    """URL of a real HTTP endpoint on 127.0.0.1 that answered once and was then stopped."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # it was up
    thread.join(timeout=5)
    server.server_close()
    return f"http://127.0.0.1:{port}/v1/chat/completions"


__all__ = ["FaultPlan", "Injector", "injector_for", "stopped_endpoint"]
