"""``replay``: play a recorded action list, then submit (or hand over to another policy).

Used to reproduce an episode and, by branching, to bring a fresh instance to a prepared state by
replaying its first k steps (the "replay" fork method). A recording is a list of actions; a
recording for a suite maps task ids to lists. On disk it is JSON::

    {"actions": [{"kind": "key", "payload": {"keys": "ctrl+b"}}, ...]}          # one list
    {"tasks": {"writer-fix-typo": [{"kind": "type", "payload": {"text": "x"}}]}}  # per task

``record(actions)`` / ``save(path, ...)`` write the same format; an environment that keeps the
actions it applied (``DesktopEnv.history``) can be saved directly.

Contract: like every policy, ``begin(task, rng)`` then ``act(obs)``; each action carries the
generation of the observation it answers. A recording that names tasks but not the current one
raises ``UsageError`` at ``begin`` (a replay of nothing would silently score as a failure).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, Action, ActionSpec, Observation, Task
from drumsbench.policies.scripted import Policy

Recording = list[ActionSpec] | dict[str, list[ActionSpec]]


def _spec(item: Any, where: str) -> ActionSpec:
    if isinstance(item, ActionSpec):
        return item
    if not isinstance(item, Mapping) or "kind" not in item:
        raise UsageError(f"{where}: each action needs a 'kind' (and optionally a 'payload' object)")
    payload = item.get("payload", {k: v for k, v in item.items() if k != "kind"})
    if not isinstance(payload, Mapping):
        raise UsageError(f"{where}: 'payload' must be an object")
    return ActionSpec(str(item["kind"]), dict(payload))


def parse(data: Any, where: str = "recording") -> Recording:
    """A recording from its JSON form (see the module doc)."""
    if isinstance(data, Mapping) and "tasks" in data:
        tasks = data["tasks"]
        if not isinstance(tasks, Mapping):
            raise UsageError(f"{where}: 'tasks' must map task ids to action lists")
        return {str(t): [_spec(a, f"{where}: task {t}") for a in acts] for t, acts in tasks.items()}
    if isinstance(data, Mapping) and "actions" in data:
        data = data["actions"]
    if not isinstance(data, list):
        raise UsageError(f"{where}: expected {{'actions': [...]}} or {{'tasks': {{id: [...]}}}}")
    return [_spec(a, where) for a in data]


def load(path: str | Path) -> Recording:
    p = Path(path)
    try:
        return parse(json.loads(p.read_text()), str(p))
    except OSError as e:
        raise UsageError(f"replay recording {p}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise UsageError(f"replay recording {p}: not valid JSON ({e})") from None


def record(actions: Sequence[ActionSpec] | Mapping[str, Sequence[ActionSpec]]) -> dict[str, Any]:
    """The JSON form of a recording (``SUBMIT`` entries are dropped: replay submits by itself)."""
    def one(acts: Sequence[ActionSpec]) -> list[dict[str, Any]]:
        return [{"kind": a.kind, "payload": dict(a.payload)} for a in acts if a.kind != SUBMIT]

    if isinstance(actions, Mapping):
        return {"tasks": {t: one(a) for t, a in actions.items()}}
    return {"actions": one(actions)}


def save(path: str | Path, actions: Sequence[ActionSpec] | Mapping[str, Sequence[ActionSpec]]) -> None:
    Path(path).write_text(json.dumps(record(actions), indent=1) + "\n")


class Replay(Policy):
    """Plays ``recording`` (``SUBMIT`` entries end it early); then ``then`` continues, or it submits."""

    name = "replay"

    def __init__(self, recording: Recording | str | Path, then: Policy | None = None) -> None:
        super().__init__()
        self.recording: Recording = load(recording) if isinstance(recording, str | Path) else recording
        self.then = then
        self._task: Task | None = None
        self._rng: random.Random | None = None
        self._handed_over = False

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        if isinstance(self.recording, dict):
            if task.id not in self.recording:
                raise UsageError(f"replay: the recording has no actions for task {task.id!r} "
                                 f"(it has {', '.join(sorted(self.recording)) or 'none'})")
            acts = self.recording[task.id]
        else:
            acts = self.recording
        out: list[ActionSpec] = []
        for a in acts:
            if a.kind == SUBMIT:
                break
            out.append(a)
        return out

    def begin(self, task: Task, rng: random.Random) -> None:
        super().begin(task, rng)
        self._task, self._rng, self._handed_over = task, rng, False

    def act(self, obs: Observation) -> Action:
        if self._i < len(self._plan):
            spec = self._plan[self._i]
            self._i += 1
            return Action.of(spec, obs.generation)
        if self.then is None:
            return Action(SUBMIT, obs.generation)
        if not self._handed_over:
            assert self._task is not None and self._rng is not None
            self.then.begin(self._task, self._rng)
            self._handed_over = True
        return self.then.act(obs)

    @property
    def length(self) -> int:
        """Actions replayed in the current episode."""
        return len(self._plan)
