"""One attempt, start to end, with the gates of docs/design.md in order.

``run_attempt`` is synchronous (executors run it in worker threads or remote actors). It never
raises for anything that happens to the attempt: every path ends in an ``AttemptRecord`` with one
outcome. Infrastructure faults become ``invalid`` with their cause, never reward 0; unexpected
harness errors become ``invalid/substrate_failure`` with the error in ``detail``.

Attribution (docs/attribution.md): an outcome is infrastructure only with evidence out of the
policy's reach. A step, episode or verifier timeout is invalid only when ``Sandbox.probe`` finds
the sandbox frozen, gone or unresponsive; in a live sandbox it is the policy's hang: failed, with
the reason. Running past ``max_steps`` is the policy's truncation (failed). What the code under
test does during verification is reported by the runner (``PolicyFault``: failed).

Faults are injected by the attempt's ``faults.Injector`` at fixed points; this module has no
branch per injected cause.

A sandbox that ended an attempt invalid (whatever the cause) is destroyed, never handed to the
next attempt: an invalid attempt is one the harness could not account for, and whatever made it
so (a dead container, a spoiled shell, a full memory group, a straggling process) must not reach
the successor's outcome. So is one the policy's own doing ended early (``PolicyFault.destroy``:
a hang, a dead container).
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from drumsbench.core.errors import (
    InvalidAttempt,
    MissingDependency,
    PolicyFault,
    PolicyUnavailable,
    SubstrateError,
    UsageError,
)
from drumsbench.core.outcome import InvalidCause, Outcome, Verdict
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.base import (
    SUBMIT,
    Action,
    Environment,
    Observation,
    RestoringReset,
    Task,
    TaskImages,
    VerifierNotes,
)
from drumsbench.policies.scripted import Policy
from drumsbench.rollout import gates
from drumsbench.rollout.faults import Injector, injector_for
from drumsbench.rollout.isolation import CanaryRegistry, plant
from drumsbench.substrates.base import RecipeImages, ResetStrategy, Sandbox, SandboxFrozen, Substrate


class RolloutConfig(BaseModel, frozen=True):
    step_timeout_s: float = Field(30.0, gt=0)
    episode_timeout_s: float = Field(300.0, gt=0)
    think_time_s: float = Field(0.0, ge=0)
    # None: in_place when the substrate has it; "restore": the environment restores a checkpoint of
    # the task's verified start (``RestoringReset``) in a sandbox reset in place
    reset: ResetStrategy | Literal["restore"] | None = None
    max_steps: int = Field(400, gt=0)
    verify_timeout_s: float | None = Field(None, gt=0)  # None: the task's own

    @model_validator(mode="after")
    def _timeouts(self) -> RolloutConfig:
        if self.episode_timeout_s <= self.step_timeout_s:
            raise UsageError(f"--episode-timeout ({self.episode_timeout_s:g} s) must be longer than "
                             f"--step-timeout ({self.step_timeout_s:g} s)")
        return self


@dataclass
class Slot:
    """One worker's place: its environment (which keeps the generation) and current sandbox."""

    substrate: Substrate
    env: Environment[Any]  # any kind, over its own task type
    worker: int = 0
    sandbox: Sandbox | None = None
    last_action: Action | None = None
    on_sandbox: Callable[[Sandbox | None], None] = field(default=lambda _b: None)

    def provision(self, task: Task | None = None) -> float:
        """A new sandbox attached to the environment: of ``task``'s own image where the environment
        brings one per task (``TaskImages``: built first when absent), else the substrate's."""
        t0 = time.monotonic()
        env = self.env
        if isinstance(env, TaskImages) and task is not None:
            if not isinstance(self.substrate, RecipeImages):
                raise UsageError(f"the {env.kind} environment needs a substrate that builds task images "
                                 f"(RecipeImages); {self.substrate.name} does not")
            env.use_images(self.substrate, self.substrate.limits)
            image = self.substrate.build_recipe(env.start_image(task))
            self.sandbox = self.substrate.create_from_image(image, env.task_limits(task, self.substrate.limits))
        else:
            self.sandbox = self.substrate.create()
        self.env.attach(self.sandbox)
        self.on_sandbox(self.sandbox)
        return time.monotonic() - t0

    def destroy(self) -> float:
        t0 = time.monotonic()
        if self.sandbox is not None:
            box, self.sandbox = self.sandbox, None
            self.on_sandbox(None)
            self.env.release()
            box.destroy()
        return time.monotonic() - t0


def run_attempt(
    slot: Slot,
    task: Task,
    policy: Policy,
    cfg: RolloutConfig,
    canaries: CanaryRegistry,
    *,
    run_id: str,
    seq: int,
    seed: int,
    fault: InvalidCause | None = None,
    meta: dict[str, object] | None = None,
    prepared: dict[str, object] | None = None,
) -> AttemptRecord:
    """One attempt. With ``prepared`` (a continuation of a branch) the slot's sandbox already holds
    a forked state: it is not reset, and gate 1 checks that it is faithful to ``prepared`` (the
    parent's ``Environment.capture()``) instead of the task's start fingerprint."""
    t_start = time.time()
    injector = injector_for(fault)
    ep = _Episode(slot, task, injector.wrap_policy(policy), cfg, canaries, random.Random(f"{seed}:{seq}"),
                  injector, prepared)
    destroy = False
    try:
        verdict = ep.run()
    except PolicyFault as e:
        verdict, destroy = ep.failed(e.reason), e.destroy
    except InvalidAttempt as e:
        verdict = Verdict.invalid(e.cause, e.detail)
    except SubstrateError as e:
        verdict = Verdict.invalid(InvalidCause.SUBSTRATE_FAILURE, str(e))
    except PolicyUnavailable as e:
        verdict = Verdict.invalid(InvalidCause.POLICY_UNAVAILABLE, str(e))
    except Exception as e:  # a harness bug must not become training signal either
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        verdict = Verdict.invalid(InvalidCause.SUBSTRATE_FAILURE, f"harness error: {tb}")
    if ep.token:
        canaries.retire(ep.token)
    injector.after_attempt(canaries)
    teardown = 0.0
    if verdict.outcome is Outcome.INVALID or destroy:
        try:
            teardown = slot.destroy()
        except Exception as e:  # the attempt stays invalid; say that the destroy failed too
            verdict = Verdict.invalid(verdict.cause or InvalidCause.SUBSTRATE_FAILURE,
                                      f"{verdict.detail}; destroy failed: {e}")
    fields = dict(meta or {})
    given = fields.pop("extra", None)
    extra = {**(given if isinstance(given, dict) else {}), **policy.notes(), **ep.reset_note, **ep.verify_note,
             **({"verifier_evidence": ep.verifier_evidence} if ep.verifier_evidence else {})}
    return AttemptRecord(
        run_id=run_id,
        seq=seq,
        task=task.id,
        substrate=slot.substrate.name,
        env=slot.env.kind,
        policy=policy.name,
        worker=slot.worker,
        generation=slot.env.generation,
        outcome=verdict.outcome,
        cause=verdict.cause,
        reward=verdict.reward,
        injected=fault,
        detail=verdict.detail[:500],
        t_start=t_start,
        t_end=time.time(),
        provision_s=ep.phases.get("provision", 0.0),
        reset_s=ep.phases.get("reset", 0.0),
        steps_s=ep.steps,
        verify_s=ep.phases.get("verify", 0.0),
        teardown_s=teardown,
        extra=extra,
        **fields,
    )


class _Episode:
    """The body of one attempt; raises ``InvalidAttempt`` (or a substrate/policy error) on a fault,
    ``PolicyFault`` when the policy's own doing ended it."""

    def __init__(self, slot: Slot, task: Task, policy: Policy, cfg: RolloutConfig,
                 canaries: CanaryRegistry, rng: random.Random, injector: Injector,
                 prepared: dict[str, object] | None = None) -> None:
        self.slot, self.env, self.task, self.policy, self.cfg = slot, slot.env, task, policy, cfg
        self.canaries, self.rng, self.inject, self.prepared = canaries, rng, injector, prepared
        self.phases: dict[str, float] = {}
        # a reset by restore, or an in-place reset that failed and was replaced: how it went (in extra)
        self.reset_note: dict[str, object] = {}
        self.verify_note: dict[str, object] = {}  # how the verifier reached its verdict (recorded in extra)
        self.verifier_evidence: dict[str, object] = {}  # what it counted (``VerifierResult.evidence``)
        self.steps: list[float] = []
        self.token: str | None = None
        self.deadline = 0.0
        # the run's episode limit, or the task's own when shorter (a Harbor task's [agent] timeout_sec)
        self.episode_limit = min(cfg.episode_timeout_s, task.agent_timeout or cfg.episode_timeout_s)

    def run(self) -> Verdict:
        env, cfg, inject = self.env, self.cfg, self.inject
        if self.prepared is None:
            self._reset()
        inject.after_reset(env)
        if self.prepared is None:
            gates.check_reset(env, self.task)  # gate 1
        else:
            gates.check_faithful(env, self.prepared)  # gate 1 for a continuation
        box = env.box
        self.token = self.canaries.issue(box.id)  # planted after gate 1: the digests never see it
        plant(box, self.token)

        self.deadline = time.monotonic() + self.episode_limit
        inject.before_observe(env)
        try:
            obs = env.observe(min(cfg.step_timeout_s, self.episode_limit))
        finally:
            inject.after_observe(env)
        if obs.timed_out:
            self._timed_out(InvalidCause.STEP_TIMEOUT, "the first observation timed out")
        gates.check_observation(env, obs)  # gate 4

        self.policy.begin(self.task, self.rng)
        while True:
            self._check_deadline()
            if cfg.think_time_s:
                time.sleep(min(cfg.think_time_s, max(0.0, self.deadline - time.monotonic())))
            action = self.policy.act(obs)
            if action.kind == SUBMIT:
                env.check_generation(action)  # gate 2 holds for the submit too
                break
            if env.step_count >= cfg.max_steps:
                raise PolicyFault(f"truncated: the policy did not submit within {cfg.max_steps} steps")
            obs = self._step(action)

        inject.before_stage_verifier(env)
        t0 = time.monotonic()
        try:
            try:
                env.stage_verifier(self.task)
            except SubstrateError as e:
                self._own_disk_full(e)
                raise
            inject.after_stage_verifier(env)
            result = env.run_verifier(self.task, self.cfg.verify_timeout_s or self.task.verify_timeout)  # gate 5
            done, reason = result.passed, result.reason
            self.verifier_evidence = dict(result.evidence)
        except PolicyFault as e:
            if e.destroy:
                raise
            done, reason = False, e.reason
        except MissingDependency as e:
            self._missing_dependency(e)
        finally:
            self.phases["verify"] = time.monotonic() - t0
            if isinstance(env, VerifierNotes):
                self.verify_note = dict(env.verify_note)
        inject.after_verify(env, self.token, self.canaries)
        gates.check_isolation(env, self.token, self.canaries)  # gate 6
        return Verdict.success() if done else Verdict.failed(reason)

    def _own_disk_full(self, e: SubstrateError) -> None:
        """``PolicyFault`` (sandbox destroyed) when staging the verifier failed on a full disk that is
        the sandbox's own enforced bound: the policy's writes filled it, never the harness's few
        files. Where the bound is not enforced the full disk is the host's, an infrastructure fault."""
        if "no space left on device" not in str(e).lower():
            return
        mechanism = self.slot.substrate.limit_mechanisms().get("disk_mb", "")
        if mechanism.startswith(("not enforced", "off")):
            return
        raise PolicyFault(f"the sandbox's disk bound was full when the verifier was staged (its own writes "
                          f"filled it): {str(e)[:200]}", destroy=True)

    def failed(self, reason: str) -> Verdict:
        """The policy ended the attempt; gate 6 still applies (a contaminated attempt is invalid)."""
        if self.token is not None and self.slot.sandbox is not None:
            try:
                gates.check_isolation(self.env, self.token, self.canaries)
            except InvalidAttempt as e:
                return Verdict.invalid(e.cause, e.detail)
            except Exception:
                pass
        return Verdict.failed(reason)

    def _timed_out(self, cause: InvalidCause, what: str) -> None:
        """Attribute a timeout: evidence out of the policy's reach -> invalid (the sandbox's own
        state, ``Sandbox.probe``, and what the environment runs around it: a desktop whose
        LibreOffice was killed under a step that awaited its window); none -> the policy's hang
        (failed, the sandbox destroyed)."""
        evidence = self.env.failure_evidence()
        if evidence:
            raise InvalidAttempt(cause, f"{what}: {evidence}")
        raise PolicyFault(f"{what} in a live sandbox (the policy's action hung)", destroy=True)

    def _missing_dependency(self, e: MissingDependency) -> None:
        """Confirm in a fresh sandbox of the same substrate that the module is missing there too."""
        fresh = self.slot.substrate.create()
        try:
            res = fresh.exec(["python3", "-I", "-c", "import importlib.util, sys\n"
                              "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)", e.module],
                             timeout=30, cwd=fresh.paths.root)
        finally:
            fresh.destroy()
        if res.exit_code == 3:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"{e.detail} (a fresh sandbox lacks it too)")
        raise PolicyFault(f"{e.detail}, but a fresh sandbox has it: the attempt removed it")

    def _reset(self) -> None:
        slot = self.slot
        strategies = slot.substrate.capabilities.reset_strategies
        restoring = self.cfg.reset == "restore"
        if restoring and not isinstance(self.env, RestoringReset):
            raise UsageError(f"--reset restore: the {self.env.kind} environment cannot reset by restore")
        auto = ResetStrategy.IN_PLACE if ResetStrategy.IN_PLACE in strategies else ResetStrategy.RECREATE
        strategy = auto if self.cfg.reset is None or self.cfg.reset == "restore" else self.cfg.reset
        own_image = isinstance(self.env, TaskImages)
        if slot.sandbox is None:
            self.phases["provision"] = slot.provision(self.task)
            t0 = time.monotonic()
        else:
            t0 = time.monotonic()
            # a task's own image is its whole start state: a fresh sandbox of it, never a reset in place
            fresh = strategy is not ResetStrategy.IN_PLACE or own_image
            if not fresh:
                try:
                    slot.sandbox.reset_in_place()
                except SubstrateError as e:
                    # An earlier attempt may have spoiled what the reset runs inside (a container's
                    # root removed /bin/sh): its sabotage must not reach this attempt. A fresh
                    # sandbox instead; a substrate that cannot make one fails here, as always.
                    self.reset_note = {"reset_in_place_failed": str(e)[:200]}
                    fresh = True
            if fresh:
                slot.destroy()
                slot.provision(self.task)
        if isinstance(self.env, RestoringReset) and restoring:
            self.env.reset_by_restore(self.task, slot.substrate.create)
            self.reset_note = {f"reset_{k}" if k != "reset" else k: v for k, v in self.env.reset_note.items()}
        else:
            self.env.reset(self.task)
        self.phases["reset"] = time.monotonic() - t0

    def _whose_limit(self) -> str:
        return " (the task's [agent] timeout)" if self.episode_limit < self.cfg.episode_timeout_s else ""

    def _check_deadline(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self._timed_out(InvalidCause.EPISODE_TIMEOUT,
                            f"episode passed {self.episode_limit:g} s{self._whose_limit()}")
        return remaining

    def _step(self, action: Action) -> Observation:
        self.inject.before_step(self.env, self.deadline, self.cfg.step_timeout_s)
        remaining = self._check_deadline()
        step_limit = self.cfg.step_timeout_s
        limit, cause = ((step_limit, InvalidCause.STEP_TIMEOUT) if step_limit < remaining
                        else (remaining, InvalidCause.EPISODE_TIMEOUT))
        t0 = time.monotonic()
        try:
            obs = self.env.step(action, limit)  # gate 2: a stale generation is refused in here
        except SandboxFrozen as e:  # the substrate refused at once what would have hung: the same fault
            raise InvalidAttempt(cause, f"step {self.env.step_count} ({action.kind}) could not run: {e}") from None
        except SubstrateError as e:
            # The sandbox failed under the policy's action; infrastructure only if its records say so
            # (a container the policy made outgrow its memory limit ends here as failed).
            if self.env.failure_evidence():
                raise
            raise PolicyFault(f"step {self.env.step_count} ({action.kind}) ended the sandbox, whose records "
                              f"show no infrastructure fault: {e}", destroy=True) from None
        self.steps.append(time.monotonic() - t0)
        self.slot.last_action = action
        if obs.timed_out:  # gate 3
            self._timed_out(cause, f"step {obs.step} ({action.kind}) ran past {limit:.2f} s"
                                   + (f", the end of the episode{self._whose_limit()}"
                                      if cause is InvalidCause.EPISODE_TIMEOUT else ""))
        gates.check_observation(self.env, obs)  # gate 4
        return obs


__all__ = ["Outcome", "RolloutConfig", "Slot", "run_attempt"]
