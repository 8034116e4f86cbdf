"""The gates that can drop an attempt, each raising ``InvalidAttempt`` with its cause.

Order (docs/design.md): 1 verified reset, 2 generation (inside ``Environment.step``), 3 timeouts (in the
rollout loop), 4 observation validity, 5 verifier availability (inside ``run_verifier``),
6 isolation.
"""

from __future__ import annotations

from drumsbench.core.errors import InvalidAttempt, PolicyFault, SubstrateError
from drumsbench.core.fingerprint import UnreadableEntry
from drumsbench.core.outcome import InvalidCause
from drumsbench.envs.base import Environment, Observation, Task
from drumsbench.rollout.isolation import CanaryRegistry, shared_places_hits


def check_reset(env: Environment, task: Task) -> None:
    """The start state must digest to the task's fingerprint. An entry the digest cannot read (a
    leftover made unreadable) is a dirty reset too, never a skipped blind spot."""
    try:
        got = env.fingerprint()
    except UnreadableEntry as e:
        raise InvalidAttempt(InvalidCause.DIRTY_RESET, str(e)) from None
    except SubstrateError as e:
        if DIGEST_UNREADABLE not in str(e):
            raise
        raise InvalidAttempt(InvalidCause.DIRTY_RESET, str(e)) from None
    if got != task.start_fingerprint:
        raise InvalidAttempt(InvalidCause.DIRTY_RESET,
                             f"start state digests to {got[:19]}..., task expects {task.start_fingerprint[:19]}...")


# What ``Sandbox.tree_digest`` says when the in-sandbox digest met an unreadable entry (exit 3).
DIGEST_UNREADABLE = "tree digest failed (exit 3)"


def check_faithful(env: Environment, prepared: dict[str, object]) -> None:
    """A continuation must reproduce its prepared state on every dimension; else it is never used."""
    diff = [dim for dim, same in env.compare(prepared, env.capture()).items() if not same]
    if diff:
        raise InvalidAttempt(InvalidCause.DIRTY_RESET, f"continuation unfaithful on: {', '.join(sorted(diff))}")


def check_observation(env: Environment, obs: Observation) -> None:
    problem = env.observation_problem(obs)
    if problem:
        raise InvalidAttempt(InvalidCause.BAD_OBSERVATION, problem)


def check_isolation(env: Environment, token: str, registry: CanaryRegistry) -> None:
    """Another sandbox's canary inside this one: contamination (invalid) — this attempt's policy
    cannot read a neighbour's canary, so it cannot have planted it. This sandbox's own canary in
    the host's shared places: this attempt's own code put it there (``PolicyFault``: failed, the
    leak recorded); the substrate's isolation figure is measured by the escape probes."""
    foreign = env.box.scan(env.canary_folders(), registry.others(token))
    if foreign:
        raise InvalidAttempt(InvalidCause.CONTAMINATION,
                             f"other sandboxes' canaries found inside: {', '.join(sorted(foreign))}")
    leaked = shared_places_hits(token)
    if leaked:
        raise PolicyFault(f"the attempt leaked its own canary to the host: {', '.join(leaked)}")
