"""One served session: an OpenEnv ``Environment`` whose episodes are DrumsBench attempts.

- ``reset(seed=, task=, client=, policy=)`` starts an attempt on the session's sandbox (provisioned
  at the first reset, reused in place afterwards) and returns its first observation, or the final
  one when a gate dropped the attempt before the policy acted (e.g. ``dirty_reset``).
- ``step(action)`` hands the action to the attempt and returns the next observation; ``submit``
  returns the final one: ``reward`` 1 / 0 / ``None`` with ``outcome``, ``cause`` and ``valid``.
- ``close()`` (client gone, session reaped, stateless HTTP request over) ends an unfinished attempt
  as ``invalid/policy_unavailable`` and destroys the sandbox.

The server never trusts the client for anything a gate decides: the generation is checked by the
environment, timeouts and the verifier run server-side, and a malformed action (a missing field,
an unknown kind) is the policy's own failed step.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Annotated, Any

from openenv.core.env_server.interfaces import Environment as OEEnvironment
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from drumsbench.serve.hub import Episode, Hub
from drumsbench.serve.wire import (
    DrumsAction,
    DrumsObservation,
    DrumsState,
    action_problem,
    final_observation,
    live_observation,
)

GONE = "the client's session ended before it submitted (disconnected, reset, or a stateless HTTP /reset)"

Name = Annotated[StrictStr, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class BadRequest(ValueError):
    """A client's request the server refuses before anything starts (HTTP 422; a WebSocket error
    frame): one line naming the field."""


class ResetArgs(BaseModel):
    """What a client may pass to ``reset``: names are short printable strings (never a number, a
    list or NaN), the seed a whole number from 0 to 2^63 - 1 (as OpenEnv's own HTTP model reads it:
    "7" is 7, 1.5 is refused); anything else is refused before an episode starts."""

    model_config = ConfigDict(extra="ignore")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    episode_id: Name | None = None
    task: Name | None = None
    client: Name | None = None
    policy: Name | None = None

    @classmethod
    def check(cls, **given: object) -> ResetArgs:
        try:
            return cls.model_validate(given)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "reset"
            raise BadRequest(f"reset: {field}: {first['msg']} (got {type(first.get('input')).__name__})") from None


class ServedEnv(OEEnvironment[DrumsAction, DrumsObservation, DrumsState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub
        self.id = uuid.uuid4().hex[:12]
        self.worker: int | None = None
        self.slot: Any = None
        self.episode: Episode | None = None
        self.final: DrumsObservation | None = None
        self.closed = False
        self.busy = 0
        self.idle_since = time.monotonic()
        self.episode_id: str | None = None
        self._lock = threading.RLock()
        self.close_reason = GONE
        self.close_extra: dict[str, object] = {}

    # -- activity (the reaper reads it) ---------------------------------------------------------
    def idle_for(self) -> float:
        """Seconds the session has waited for its client; 0 while a request is being answered."""
        return 0.0 if self.busy or self.closed else time.monotonic() - self.idle_since

    def _enter(self) -> None:
        self.busy += 1

    def _leave(self) -> None:
        self.busy -= 1
        self.idle_since = time.monotonic()

    def _answer_timeout(self) -> float:
        r = self.hub.cfg.rollout
        return r.episode_timeout_s + (r.verify_timeout_s or 600.0) + 120.0

    # -- OpenEnv interface ----------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
              client: str | None = None, policy: str | None = None, **kwargs: Any) -> DrumsObservation:
        args = ResetArgs.check(seed=seed, episode_id=episode_id, task=task, client=client, policy=policy)
        seed, episode_id, task, client, policy = args.seed, args.episode_id, args.task, args.client, args.policy
        with self._lock:
            self._enter()
            try:
                if self.closed:
                    raise RuntimeError("this session was closed (idle limit or shutdown); open a new one")
                self._end_episode("the client reset before it submitted")
                chosen = self.hub.pick_task(task, seed)
                if self.slot is None:
                    self.worker = self.hub.acquire()
                    self.slot = self.hub.make_slot(self.worker)
                    self.hub.envs[self.id] = self
                self.episode_id = episode_id or uuid.uuid4().hex[:12]
                self.final = None
                self.episode = Episode(self.hub, self.slot, chosen, seed if seed is not None else self.hub.cfg.seed,
                                       client or "anonymous", policy or "remote", self.id).start()
                return self._observe()
            finally:
                self._leave()

    def step(self, action: DrumsAction, timeout_s: float | None = None, **kwargs: Any) -> DrumsObservation:
        with self._lock:
            self._enter()
            try:
                ep = self.episode
                if ep is None or (self.closed and self.final is None):
                    return DrumsObservation(done=True, error="no episode in this session: reset first (HTTP /step "
                                            "is stateless; run multi-step episodes over /ws)")
                if self.final is not None:
                    return self.final.model_copy(update={"error": "the episode is over; reset for a new one"})
                problem = action_problem(self.hub.suite.actions, action)
                if problem:
                    # Reaches the environment as an unknown kind: a failed step the policy sees.
                    ep.send(f"malformed: {problem}", action.generation, {})
                else:
                    ep.send(action.kind, action.generation, action.payload())
                return self._observe(error=problem or "")
            finally:
                self._leave()

    @property
    def state(self) -> DrumsState:
        ep = self.episode
        return DrumsState(episode_id=self.episode_id, step_count=ep.slot.env.step_count if ep else 0,
                          task=ep.task.id if ep else "", generation=ep.slot.env.generation if ep else 0,
                          done=self.final is not None, run_id=self.hub.run_id)

    def get_metadata(self) -> EnvironmentMetadata:
        kind = self.hub.suite.kind
        return EnvironmentMetadata(
            name=f"drumsbench-{kind}",
            description=(f"DrumsBench {kind} environment ({self.hub.cfg.tasks} on {self.hub.cfg.substrate}): the "
                         "final observation carries reward 1/0/null with outcome, cause and valid; never "
                         "train on valid=false"),
            version="0.1.0", documentation_url="docs/serve.md")

    def mark_reaped(self, idle_s: float) -> None:
        """The reaper's note before it closes the session: why, and after how long."""
        self.close_reason = (f"no request from the client for {idle_s:.1f} s (idle limit {self.hub.cfg.idle_s:g} s): "
                             "the session was abandoned and reaped")
        self.close_extra = {"reaped": True, "idle_s": round(idle_s, 3)}

    def close(self) -> None:
        """End an unfinished attempt as invalid/policy_unavailable; destroy the sandbox; free the slot.

        Called on the server's event loop (OpenEnv closes a stateless HTTP request's session there),
        the work — which waits for the attempt's record and destroys a sandbox — goes to a thread of
        its own: the loop answers every other client meanwhile."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._close()
        threading.Thread(target=self._close, name=f"drumsbench-close-{self.id}", daemon=True).start()
        return None

    def _close(self) -> None:
        reason, extra = self.close_reason, self.close_extra
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._end_episode(reason, **extra)
            finally:
                slot, self.slot = self.slot, None
                self.hub.envs.pop(self.id, None)
                if slot is not None:
                    try:
                        slot.destroy()
                    finally:
                        self.hub.release()

    # -- helpers --------------------------------------------------------------------------------
    def _end_episode(self, reason: str, **extra: object) -> None:
        ep = self.episode
        if ep is None or ep.record is not None or self.final is not None:
            return
        ep.abort(reason, **extra)
        deadline = time.monotonic() + self._answer_timeout()
        while ep.record is None and time.monotonic() < deadline:
            kind, value = ep.next(max(0.1, deadline - time.monotonic()))
            if kind == "final":
                self.final = final_observation(value, description=ep.task.description)

    def _observe(self, error: str = "") -> DrumsObservation:
        ep = self.episode
        assert ep is not None
        kind, value = ep.next(self._answer_timeout())
        if kind == "final":
            self.final = final_observation(value, description=ep.task.description, error=error)
            return self.final
        return live_observation(value, self.hub.suite.observations, env=self.hub.suite.kind, task=ep.task.id,
                                description=ep.task.description, error=error)
