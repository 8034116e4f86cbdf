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
from pydantic import Field

from drumsbench.core.outcome import Outcome
from drumsbench.core.records import AttemptRecord
from drumsbench.envs.actions import ActionSet
from drumsbench.envs.base import Observation


class DrumsAction(OEAction):
    """One action. Coding: ``shell`` {command}, ``write`` {path, content}, ``patch`` {patch},
    ``submit``. Desktop: ``key``/``type``/``click``/... with their arguments in ``args``."""

    kind: str = Field(..., description="shell, write, patch, submit (coding); key, type, click, ... (desktop)")
    command: str | None = Field(None, description="shell: the command line")
    path: str | None = Field(None, description="write: a path inside the work folder")
    content: str | None = Field(None, description="write: the file's new content")
    patch: str | None = Field(None, description="patch: a unified diff applied with git apply")
    args: dict[str, Any] = Field(default_factory=dict, description="other arguments (desktop actions)")
    generation: int | None = Field(
        None, description="generation of the observation this action was computed from; another "
        "generation than the current one makes the attempt invalid (stale_generation); none: the current")

    def payload(self) -> dict[str, Any]:
        fields = {k: getattr(self, k) for k in ("command", "path", "content", "patch") if getattr(self, k) is not None}
        return {**self.args, **fields}


class DrumsObservation(OEObservation):
    """One observation; the final one (``done``) carries the attempt's outcome."""

    env: str = Field("", description="coding or desktop")
    task: str = Field("", description="task id")
    description: str = Field("", description="the task's goal (what the policy must achieve)")
    generation: int = Field(0, description="echo it in the next action")
    step: int = Field(0, description="actions applied so far in this episode")
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


class DrumsState(OEState):
    """``episode_id`` and ``step_count`` (OpenEnv's) plus where the session stands."""

    task: str = ""
    generation: int = 0
    done: bool = False
    run_id: str = ""


def live_observation(obs: Observation, *, env: str, task: str, description: str = "",
                     error: str = "") -> DrumsObservation:
    c = {**obs.content, **(obs.content.get("result") or {})}  # the desktop's shell: its output in "result"
    png = c.get("png")
    return DrumsObservation(
        env=env, task=task, description=description, generation=obs.generation, step=obs.step,
        exit_code=c.get("exit_code"), stdout=str(c.get("stdout", "")), stderr=str(c.get("stderr", "")),
        truncated=bool(c.get("truncated", False)),
        screenshot_png=base64.b64encode(png).decode() if isinstance(png, bytes) and png else None,
        title=c.get("title") if "title" in c else None,
        error=error or str(c.get("error", "")), done=False, reward=None)


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
