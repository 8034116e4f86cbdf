"""The error contract.

- ``UsageError``: bad input from a user (a flag, a file). The CLI prints its one-line message and
  exits 2, never a traceback. The message names the field and the fix.
- ``SubstrateError``: the substrate itself failed (could not create, exec, copy, destroy). The
  attempt becomes ``invalid/substrate_failure``. A command that fails *inside* a sandbox is not
  an error: it returns a normal ``ExecResult``.
- ``InvalidAttempt``: raised by a gate; carries the ``InvalidCause``.
- ``PolicyFault``: the policy's own actions or code ended the attempt (a hang in a live sandbox,
  an exit or signal of the code under test, a refused operation, running past the step limit).
  The attempt is valid and failed (reward 0), with the reason recorded — never invalid.
- ``LedgerUnwritable``: the ledger refused a write (a full disk): the run stops handing out work,
  drops what is in flight, and the CLI prints one line (exit 2); every attempt recorded before
  stays, and ``run --resume`` continues once there is room.
- ``ImageBuildError``: a start state given as a recipe (a task's own Dockerfile) did not build: the
  task's recipe or what its steps fetch, not the policy (who never runs at build time). The message
  names the step and the builder's last lines.
- ``MissingDependency``: a hidden test needs a module the sandbox lacks; the rollout confirms it
  in a fresh sandbox before it calls the attempt invalid (the policy may have deleted it).
"""

from __future__ import annotations

from drumsbench.core.outcome import InvalidCause


class DrumsError(Exception):
    """Base of DrumsBench's own errors."""


class UsageError(DrumsError):
    """Bad user input: one line naming the field and the fix. CLI exit code 2."""


class LedgerUnwritable(DrumsError):
    """The ledger refused to record an attempt (e.g. a full disk); the run stopped cleanly."""


class SubstrateError(DrumsError):
    """The substrate failed (not the command inside it)."""


class InvalidAttempt(DrumsError):
    """A gate dropped the attempt."""

    def __init__(self, cause: InvalidCause, detail: str = "") -> None:
        super().__init__(f"{cause}: {detail}" if detail else str(cause))
        self.cause = cause
        self.detail = detail


class StaleGeneration(InvalidAttempt):
    """The environment refused an action computed from an observation of an earlier generation."""

    def __init__(self, action_generation: int, current: int) -> None:
        super().__init__(
            InvalidCause.STALE_GENERATION,
            f"action of generation {action_generation} refused; current generation is {current}",
        )


class PolicyUnavailable(DrumsError):
    """The policy's inference endpoint could not be reached (not a bad choice of the policy)."""


class PolicyFault(DrumsError):
    """The policy's own doing ended the attempt: valid, failed, with ``reason``.

    ``destroy``: the sandbox may still hold what the policy left (a hung process) and must not be
    reused."""

    def __init__(self, reason: str, *, destroy: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.destroy = destroy


class MissingDependency(DrumsError):
    """A hidden test imports ``module``, which the sandbox's Python does not find."""

    def __init__(self, module: str, detail: str) -> None:
        super().__init__(detail)
        self.module = module
        self.detail = detail


class ImageBuildError(SubstrateError):
    """A task's image recipe did not build (see the module's contract): ``step`` names where."""

    def __init__(self, detail: str, step: str = "") -> None:
        super().__init__(detail)
        self.step = step
