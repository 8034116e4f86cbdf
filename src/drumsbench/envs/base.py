"""The environment interface: a task world hosted in a sandbox.

Contracts:
- ``reset(task)`` writes the task's start state into the attached sandbox (already emptied by the
  substrate's reset), plants nothing else, increments ``generation`` and returns nothing; the
  rollout then checks ``fingerprint()`` against ``task.start_fingerprint`` (gate 1).
- ``observe()`` returns the first observation of an episode; ``step(action, timeout)`` applies an
  action and returns the next one. ``step`` refuses (raises ``StaleGeneration``) an action whose
  generation is not the current one, before touching the sandbox.
- An observation that timed out has ``timed_out`` set; the rollout decides which timeout it was.
- ``observation_problem(obs)`` names what makes an observation unusable (gate 4) or is ``None``.
- ``stage_verifier(task)`` then ``run_verifier(task, timeout)``: a ``VerifierResult`` — passed, or
  failed with its reason ("not done" is a result, never an error); ``InvalidAttempt(verifier_unavailable)``
  when the verifier could not give an answer.
- ``run_verifier`` may raise ``PolicyFault`` (the code under test ended the verification, or left
  the sandbox unusable: failed, with its reason) and ``MissingDependency`` (the rollout confirms it
  in a fresh sandbox).
- ``break_verifier()`` damages the staged verifier from the host (fault injection). Environments
  whose observations do not travel through ``Sandbox.exec`` offer ``BreakableObservation``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from drumsbench.core.errors import StaleGeneration
from drumsbench.envs.actions import ActionSet
from drumsbench.substrates.base import ImageRecipe, RecipeImages, Sandbox, SandboxLimits

if TYPE_CHECKING:
    from drumsbench.envs.observations import ObservationModel


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """An action before it is tied to an observation: what scripted plans are made of."""

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    generation: int
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: ActionSpec, generation: int) -> Action:
        return cls(spec.kind, generation, spec.payload)


SUBMIT = "submit"


@dataclass(frozen=True, slots=True)
class VerifierResult:
    """What a verifier that ran and answered says: ``passed``, or not with its ``reason`` (a failed
    result without a reason cannot be made). ``evidence``: what it counted (JSON values, e.g. tests
    run and passed), recorded with the attempt (``extra.verifier_evidence``). A verifier that could
    not answer raises ``InvalidAttempt`` instead; one the policy's code ended raises ``PolicyFault``."""

    passed: bool
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.passed and not self.reason.strip():
            raise ValueError("a failed verification needs its reason")
        if self.passed and self.reason:
            raise ValueError("a passed verification has no reason")

    @classmethod
    def success(cls, **evidence: Any) -> VerifierResult:
        return cls(True, "", evidence)

    @classmethod
    def failed(cls, reason: str, **evidence: Any) -> VerifierResult:
        return cls(False, reason, evidence)


@dataclass(frozen=True, slots=True)
class Observation:
    generation: int
    step: int
    content: dict[str, Any]
    timed_out: bool = False


class Task(ABC):
    """One start state + goal + verifier. Scripted policies use the plans."""

    id: str
    env_kind: ClassVar[str]
    description: str
    start_fingerprint: str
    verify_timeout: float = 60.0
    # the task's own limit on an episode (a Harbor task's ``[agent] timeout_sec``); the run's
    # ``--episode-timeout`` applies when it is shorter or this is None
    agent_timeout: float | None = None

    @abstractmethod
    def oracle_plan(self) -> list[ActionSpec]:
        """Actions that solve the task (ending with submit)."""

    @abstractmethod
    def wrong_plan(self, choice: int) -> list[ActionSpec]:
        """A plausible wrong attempt (ending with submit); ``choice`` picks among several."""

    @abstractmethod
    def explore_action(self, i: int) -> ActionSpec:
        """The i-th harmless exploring action (reads, listings)."""

    @property
    def wrong_choices(self) -> int:
        return 1

    def branch_prefix(self, k: int) -> list[ActionSpec]:
        """The k actions that lead to a branch's prepared state (default: k exploring actions)."""
        return [self.explore_action(i) for i in range(k)]

    def continuation(self, k: int, solve: bool, choice: int = 0) -> list[ActionSpec]:
        """What a continuation does after ``branch_prefix(k)``: the rest of a solving plan, or a
        wrong one. Default: the whole plans (the default prefix only explores)."""
        return self.oracle_plan() if solve else self.wrong_plan(choice)


TaskT = TypeVar("TaskT", bound=Task)


class Environment(ABC, Generic[TaskT]):
    """An environment kind over its own task type ``TaskT``: ``reset``, ``stage_verifier`` and
    ``run_verifier`` take that type (a kind never narrows a ``Task`` itself); the rollout, which
    holds any kind, sees ``Environment[Any]``."""

    kind: ClassVar[str]
    # the kind's actions as typed models (``envs/actions.py``): the wire's check, the endpoint
    # policy's tools and gymnasium's action names are made from them
    actions: ClassVar[ActionSet]
    # what its observations show a policy, typed (``envs/observations.py``): the wire's fields,
    # gymnasium's observation space and the endpoint policy's prompt are read through it
    observations: ClassVar[type[ObservationModel]]
    # what an endpoint model is told before the task (its system prompt)
    instructions: ClassVar[str]
    # capability interfaces (substrates/base.py) its sandboxes must implement; checked up front
    requires: ClassVar[tuple[type, ...]] = ()
    # the image flavor (``drumsbench.images.FLAVORS``) its sandboxes need where a substrate builds
    # images (``ImageFlavors``: docker, podman); substrates on the host's own files ignore it
    image_flavor: ClassVar[str] = "base"

    @classmethod
    def unmet(cls, sandbox_class: type[Sandbox] | None) -> list[str]:
        """The required capabilities a substrate's sandboxes lack (empty when they fit, or when the
        substrate does not declare its sandbox class: then the first sandbox tells)."""
        if sandbox_class is None:
            return []
        return [r.__name__ for r in cls.requires if not issubclass(sandbox_class, r)]

    def __init__(self) -> None:
        self.generation = 0
        self.step_count = 0
        self.sandbox: Sandbox | None = None
        # where an environment keeps what it shows people (screenshots): the run's output folder,
        # handed over by the job that makes the environment; None: nothing is kept
        self.artifact_dir: Path | None = None

    def attach(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def release(self) -> None:
        """Let go of what this environment keeps in its attached sandbox (helpers, servers and the
        harness's descriptors to them), before the slot destroys that sandbox: they would otherwise
        be held until the next reset. Idempotent; the default keeps nothing."""
        return None

    @property
    def box(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("environment has no sandbox attached")
        return self.sandbox

    def reset(self, task: TaskT) -> None:
        self._write_start(task)
        self.generation += 1
        self.step_count = 0

    def check_generation(self, action: Action) -> None:
        """Gate 2: ``StaleGeneration`` unless ``action`` (any action, the submit too) was computed
        from an observation of the current generation."""
        if action.generation != self.generation:
            raise StaleGeneration(action.generation, self.generation)

    def step(self, action: Action, timeout: float) -> Observation:
        self.check_generation(action)
        self.step_count += 1
        return self._apply(action, timeout)

    @abstractmethod
    def _write_start(self, task: TaskT) -> None: ...

    @abstractmethod
    def fingerprint(self) -> str: ...

    @abstractmethod
    def observe(self, timeout: float) -> Observation: ...

    @abstractmethod
    def _apply(self, action: Action, timeout: float) -> Observation: ...

    @abstractmethod
    def observation_problem(self, obs: Observation) -> str | None: ...

    @abstractmethod
    def stage_verifier(self, task: TaskT) -> None: ...

    @abstractmethod
    def run_verifier(self, task: TaskT, timeout: float) -> VerifierResult: ...

    @abstractmethod
    def break_verifier(self) -> None:
        """Really break the staged verifier (fault injection): it must crash when run."""

    def capture(self) -> dict[str, Any]:
        """The live state a continuation of a branch must reproduce, by dimension (JSON values).

        Environments that support branching override it (coding: the work tree; desktop: pixels,
        text, cursor, selection, undo stack, modified flag, dialogs, lock files)."""
        raise NotImplementedError(f"{self.kind} cannot be branched")

    def compare(self, prepared: dict[str, Any], now: dict[str, Any]) -> dict[str, bool]:
        """Per dimension: is ``now`` faithful to ``prepared``? Exact equality unless overridden
        (e.g. a pixel tolerance for a blinking cursor)."""
        return {dim: now.get(dim) == value for dim, value in prepared.items()}

    def failure_evidence(self) -> str | None:
        """After the sandbox failed under a policy's action: evidence out of the policy's reach that
        infrastructure failed (``Sandbox.probe``), or None. Environments that run their own
        processes around the sandbox (the desktop) add theirs."""
        return self.box.probe()

    def canary_folders(self) -> list[str]:
        """In-sandbox folders searched for other sandboxes' canaries."""
        p = self.box.paths
        return [p.work, p.home, p.tmp]


class Resumable(ABC, Generic[TaskT]):
    """Capability of an environment whose task lives in a running application: ``resume`` starts it on
    task files copied into a fresh sandbox (the ``file`` fork method), as the task's reset would."""

    @abstractmethod
    def resume(self, task: TaskT) -> None: ...


class MachineForks(ABC, Generic[TaskT]):
    """Capability of an environment whose task lives in running processes that a whole-machine fork
    copies as they are (the vm's ``snapshot`` fork method: RAM, devices and disk). ``handover``, on
    the parent, says what a continuation needs to take the copy over (JSON-able: what names the
    running instance inside the machine); ``adopt_fork`` takes it over in a continuation's attached
    sandbox, with the task and the actions so far. The generation is left as the fork set it.
    ``SubstrateError`` when the sandbox's fork did not copy the running processes."""

    @abstractmethod
    def handover(self) -> dict[str, object]: ...

    @abstractmethod
    def adopt_fork(self, task: TaskT, history: list[ActionSpec], handover: dict[str, object]) -> None: ...


class RestoringReset(ABC, Generic[TaskT]):
    """Capability of an environment that can reset by restoring a checkpoint of the task's verified
    start (``--reset restore``) instead of building it again.

    ``reset_by_restore(task, spare)`` has ``reset``'s contract (the start state in the attached,
    already emptied sandbox; ``generation`` + 1) and the same gate 1 follows. ``spare`` makes a new
    sandbox of the same substrate (where the checkpoint is made, once per task). When a restore
    fails the environment starts the task cold instead; ``reset_note`` says which it did
    (``{"reset": "restore" | "cold", ...}``, recorded in the attempt's ``extra``)."""

    reset_note: dict[str, object]

    @abstractmethod
    def reset_by_restore(self, task: TaskT, spare: Callable[[], Sandbox]) -> None: ...


class VerifierNotes(ABC):
    """Capability of an environment whose verifier can run in more than one way: after each
    ``run_verifier`` (whatever it returned or raised), ``verify_note`` says how the verdict was
    reached (e.g. ``{"verifier": "warm"}``, or ``{"verifier": "cold", "verifier_fallback": why}``
    when the prepared runner could not start); recorded in the attempt's ``extra``."""

    verify_note: dict[str, object]


class TaskImages(ABC, Generic[TaskT]):
    """Capability of an environment whose every task brings its own start image (a Harbor task's
    Dockerfile): the whole file system is the start state. Such a kind requires ``RecipeImages``
    sandboxes. The rollout builds ``start_image(task)`` with the substrate (``build_recipe``) and
    gives every attempt a fresh sandbox of it (``create_from_image``), never a reset in place;
    ``use_images`` hands the environment that substrate and the run's sandbox bounds first, so that
    it can make sandboxes of its own (the verifier's fresh sandbox) under the same bounds."""

    @abstractmethod
    def start_image(self, task: TaskT) -> ImageRecipe: ...

    @abstractmethod
    def use_images(self, images: RecipeImages, run_limits: SandboxLimits) -> None: ...

    def task_limits(self, task: TaskT, run: SandboxLimits) -> SandboxLimits:
        """The bounds of ``task``'s sandboxes given the run's ``run`` (a task may ask for tighter
        ones: ``SandboxLimits.within``); the run's by default."""
        return run


class BreakableObservation(ABC):
    """An environment whose observation channel the host can break for real (fault injection),
    where observations do not come through ``Sandbox.exec`` (e.g. the desktop's X server)."""

    @abstractmethod
    def break_observation_channel(self) -> None:
        """Make the next observation unusable, as a real fault of the channel would."""
