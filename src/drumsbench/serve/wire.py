"""The wire format of ``drumsbench serve``: OpenEnv's action, observation and state models.

OpenEnv sends ``{"observation": ..., "reward": ..., "done": ...}`` and strips the observation's
``metadata`` from the wire, so what a trainer needs to drop an invalid episode is a typed field of
the observation: ``valid``, ``outcome`` and ``cause`` (set on the final observation only; ``None``
while the episode runs). An invalid attempt is a normal final observation — ``done: true``,
``reward: null``, ``valid: false``, ``cause`` one of the nine — never an error frame and never 0.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from openenv.core.env_server.types import Action as OEAction
from openenv.core.env_server.types import Observation as OEObservation
from openenv.core.env_server.types import State as OEState
from pydantic import Field, create_model

from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.actions import ActionSet
from drumsbench.envs.base import Observation
from drumsbench.envs.observations import ObservationModel


class DrumsAction(OEAction):
    """One action: its ``kind`` (the name of one of the served kind's typed actions) and its
    arguments, by name (``action_class`` adds each argument of the kind's actions as a field) or in
    ``args``."""

    kind: str = Field(..., description="the action's name: one of the served kind's actions")
    args: dict[str, Any] = Field(default_factory=dict, description="arguments not sent by name")
    generation: int | None = Field(
        None, description="generation of the observation this action was computed from; another "
        "generation than the current one makes the attempt invalid (stale_generation); none: the current")

    def payload(self) -> dict[str, Any]:
        """The action's arguments: ``args``, then every other field that is set (a named field wins)."""
        fields = {k: getattr(self, k) for k in type(self).model_fields
                  if k not in ACTION_OWN and getattr(self, k) is not None}
        return {**self.args, **fields}


# the wire action's own fields (not an argument of any kind's action)
ACTION_OWN = {"kind", "args", "generation", "metadata"}


def action_class(actions: ActionSet) -> type[DrumsAction]:
    """The wire's action for a kind: ``DrumsAction`` plus every argument of the kind's typed actions
    (``ActionSet``) as an optional field of its own type and description, so a client sends them by
    name and the schema OpenEnv publishes shows them. An argument two actions type differently is
    ``Any`` on the wire (``ActionSet.problem`` checks each request against its own action)."""
    types: dict[str, list[Any]] = {}
    said: dict[str, str] = {}
    for model in actions.models:
        for name, f in model.model_fields.items():
            if name not in DrumsAction.model_fields:
                types.setdefault(name, []).append(f.annotation)
                said.setdefault(name, f"{model.kind}: {f.description or name}")
    extra: dict[str, Any] = {
        name: (ts[0] | None if all(t == ts[0] for t in ts) else Any, Field(None, description=said[name]))
        for name, ts in types.items()}
    if not extra:
        return DrumsAction
    made: type[DrumsAction] = create_model("DrumsAction", __base__=DrumsAction, __doc__=DrumsAction.__doc__, **extra)
    return made


class DrumsObservation(OEObservation):
    """One observation; the final one (``done``) carries the attempt's outcome."""

    env: str = Field("", description="coding or desktop")
    task: str = Field("", description="task id")
    description: str = Field("", description="the task's goal (what the policy must achieve)")
    generation: int = Field(0, description="echo it in the next action")
    step: int = Field(0, description="actions applied so far in this episode")
    text: str = Field("", description="what the observation shows, as text (the kind's own rendering)")
    exit_code: int | None = Field(None, description="coding: the command's exit status")
    stdout: str = ""
    stderr: str = ""
    truncated: bool = Field(False, description="coding: output cut at the observation limit")
    screenshot_png: str | None = Field(None, description="desktop: the screen, PNG, base64")
    title: str | None = Field(None, description="desktop: the active window's title")
    error: str = Field("", description="what was wrong with the last request (not an outcome)")
    valid: bool | None = Field(None, description="final only: false = invalid, never train on it")
    outcome: Literal["success", "failed", "invalid"] | None = Field(None, description="final only")
    cause: str | None = Field(None, description="final and invalid only: one of the nine invalid causes")
    detail: str = Field("", description="final only: why (a failed reason or the invalid evidence)")
    attempt: str | None = Field(None, description="RUN_ID/SEQ of the attempt in the ledger")


# the wire fields a kind's observation fills by name (``ObservationModel.wire``); the rest are the
# session's own
KIND_FIELDS = {"exit_code", "stdout", "stderr", "truncated", "title"}


class DrumsState(OEState):
    """``episode_id`` and ``step_count`` (OpenEnv's) plus where the session stands."""

    task: str = ""
    generation: int = 0
    done: bool = False
    run_id: str = ""


def live_observation(obs: Observation, observations: type[ObservationModel], *, env: str, task: str,
                     description: str = "", error: str = "") -> DrumsObservation:
    """An observation of a running episode, read through its kind's model (``observations``): its
    ``text``, its screen as ``screenshot_png`` and the wire fields it fills by name."""
    shown = observations.of(obs)
    png = shown.screen_png()
    return DrumsObservation(
        env=env, task=task, description=description, generation=obs.generation, step=obs.step,
        text=shown.text(), screenshot_png=base64.b64encode(png).decode() if png else None,
        error=error or str(obs.content.get("error", "")), done=False, reward=None,
        **shown.wire(KIND_FIELDS))


def final_observation(rec: AttemptRecord, *, description: str = "", error: str = "") -> DrumsObservation:
    """The last observation of an attempt: reward 1 / 0 / None with outcome, cause and valid."""
    return DrumsObservation(
        env=rec.env, task=rec.task, description=description, generation=rec.generation,
        step=len(rec.steps_s), error=error, done=True, reward=rec.reward,
        valid=rec.outcome is not Outcome.INVALID, outcome=rec.outcome.value,
        cause=rec.cause.value if rec.cause else None, detail=rec.detail, attempt=f"{rec.run_id}/{rec.seq}")


def action_problem(actions: ActionSet, action: DrumsAction) -> str | None:
    """What makes an action malformed for the session's kind (``ActionSet.problem``: an unknown
    kind, a missing field, a wrong type), or None. Such an action reaches the environment as an
    unknown kind: a failed step the policy sees, never a harness error."""
    return actions.problem(action.kind, action.payload())
