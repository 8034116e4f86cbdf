"""Gymnasium environments: ``DrumsBench/Coding-v0`` (docs/gym.md).

``import drumsbench.gym`` registers the ids; ``gymnasium.make("DrumsBench/Coding-v0", out=...)``
runs episodes in process on a substrate (default ``process``), ``url=...`` runs them on a
``drumsbench serve`` through OpenEnv's own client. Either way each episode is a DrumsBench attempt
with every gate, recorded in the ledger like a run.

- ``terminated`` when the episode ends by ``submit`` or by a gate; ``truncated`` when the policy
  ran past ``max_steps`` (a valid failure: reward 0).
- ``info["outcome"]`` (success / failed / invalid, ``None`` until the end), ``info["cause"]`` (one
  of the nine invalid causes or ``None``), ``info["valid"]``.
- **An invalid episode's reward is ``nan``, never 0** (``invalid="raise"``: the step raises
  ``InvalidEpisode`` instead). Rewards before the end are 0.0; drop the whole episode when the
  final ``info["valid"]`` is False — from the loss and from its group's statistics.

Spaces: observation ``Dict(text=Text)`` (printable ASCII; other characters escaped as ``\\uXXXX``);
action: made from the kind's typed actions (``flat_space``: ``kind`` plus each slot its fields
declare, ``envs/actions.py``) — coding ``Dict(kind=Discrete(4): shell, write, patch, submit;
text=Text: the command, the file's content or the diff; path=Text: the file written)``. Dicts with a
string ``kind`` and fields under their own names are accepted too.
"""

from __future__ import annotations

import base64
import io
import math
import string
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from drumsbench.core.errors import UsageError
from drumsbench.envs.actions import ActionSet, Holds
from drumsbench.envs.observations import ObservationModel
from drumsbench.envs.suites import environment_class, suite_kind
from drumsbench.serve.wire import DrumsAction, DrumsObservation

PRINTABLE = string.printable
PATH_CHARS = string.ascii_letters + string.digits + "._-/"
OBS_MAX = 65536
TEXT_MAX = 4096
PATH_MAX = 128


WHEEL = 10  # a ``wheel`` slot: -WHEEL..WHEEL clicks


def flat_space(actions: ActionSet, *, text_max: int, width: int = 0, height: int = 0) -> spaces.Dict:
    """Gymnasium's action space for a kind: ``kind=Discrete(len(names))`` plus each slot the kind's
    actions declare (``ActionSet.slots``), by what it holds: ``text`` printable text up to
    ``text_max``, ``path`` a relative path, ``column``/``row`` a pixel of a ``width`` x ``height``
    screen, ``wheel`` -10..10 clicks."""
    def space(name: str, holds: Holds) -> spaces.Space[Any]:
        if holds in ("column", "row") and (width < 1 or height < 1):
            raise UsageError(f"action slot {name!r} is a pixel: give the screen's width and height")
        return {"text": lambda: spaces.Text(text_max, min_length=0, charset=PRINTABLE),
                "path": lambda: spaces.Text(PATH_MAX, min_length=1, charset=PATH_CHARS),
                "column": lambda: spaces.Discrete(width), "row": lambda: spaces.Discrete(height),
                "wheel": lambda: spaces.Discrete(2 * WHEEL + 1, start=-WHEEL)}[holds]()

    return spaces.Dict({"kind": spaces.Discrete(len(actions.names)),
                        **{name: space(name, holds) for name, holds in actions.slots().items()}})


class InvalidEpisode(RuntimeError):
    """With ``invalid="raise"``: the episode ended invalid (an infrastructure fault). ``info`` holds
    outcome, cause, valid and detail; the episode must not be trained on."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(f"invalid episode ({info.get('cause')}): {info.get('detail')}")
        self.info = info


def printable(text: str) -> str:
    return "".join(c if c in PRINTABLE else f"\\u{ord(c):04x}" for c in text)


class _Local:
    """Episodes in this process: a hub of one session (``serve.hub``), its own run in the ledger."""

    def __init__(self, substrate: str, tasks: str, out: Path, max_steps: int, step_timeout_s: float,
                 episode_timeout_s: float) -> None:
        from drumsbench.rollout.attempt import RolloutConfig
        from drumsbench.serve.hub import Hub, ServeConfig
        from drumsbench.serve.session import ServedEnv

        cfg = ServeConfig(substrate=substrate, tasks=tasks, max_sessions=1, idle_s=1e9, policy="gym agent",
                          rollout=RolloutConfig(step_timeout_s=step_timeout_s, episode_timeout_s=episode_timeout_s,
                                                max_steps=max_steps))
        self.hub = Hub(cfg, out, kind="gym").start()
        self.session = ServedEnv(self.hub)

    def reset(self, **kw: Any) -> DrumsObservation:
        return self.session.reset(**kw)

    def step(self, action: DrumsAction) -> DrumsObservation:
        return self.session.step(action)

    def close(self) -> None:
        self.session.close_reason = "the gym env was closed before the agent submitted"
        try:
            self.session.close()
        finally:
            self.hub.stop()


class _Remote:
    """Episodes on a ``drumsbench serve`` (OpenEnv's own client, one WebSocket session)."""

    def __init__(self, url: str) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=url).sync()
        self.client.connect()

    def _obs(self, result: Any) -> DrumsObservation:
        return DrumsObservation.model_validate({**result.observation, "done": result.done, "reward": result.reward})

    def reset(self, **kw: Any) -> DrumsObservation:
        return self._obs(self.client.reset(**{k: v for k, v in kw.items() if v is not None}))

    def step(self, action: DrumsAction) -> DrumsObservation:
        return self._obs(self.client.step(action.model_dump(exclude_none=True, exclude={"metadata"})))

    def close(self) -> None:
        self.client.close()


class KindEnv(gym.Env[dict[str, Any], dict[str, Any]]):
    """Episodes of the kind of the suite ``tasks`` (``DrumsBench/Coding-v0``: the coding suite;
    ``DrumsBench/Env-v0``: any suite). Made from the kind's typed models: the action space from its
    actions (``flat_space``), the observation ``Dict(text=Text)`` from its observations' ``text``
    (``ObservationModel``), after the task and what the first observation is."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012 - gymnasium's own
    text_max = TEXT_MAX

    def __init__(self, *, url: str | None = None, substrate: str = "process", tasks: str = "coding",
                 out: str | Path = "runs", max_steps: int = 50, step_timeout_s: float = 30.0,
                 episode_timeout_s: float = 300.0, client: str = "gym", invalid: str = "nan",
                 render_mode: str | None = None) -> None:
        if invalid not in ("nan", "raise"):
            raise UsageError(f"invalid: {invalid!r}; choose nan (reward nan) or raise (InvalidEpisode)")
        if render_mode not in (None, "ansi"):
            raise UsageError(f"render_mode: {render_mode!r}; only ansi")
        if max_steps < 1:
            raise UsageError(f"max_steps: {max_steps} must be at least 1")
        self.url, self.substrate, self.tasks, self.out = url, substrate, tasks, Path(out)
        env_class = environment_class(suite_kind(tasks))
        # the kind's typed actions (the action space and its reading) and observations (their text)
        self.actions: ActionSet = env_class.actions
        self.observations: type[ObservationModel] = env_class.observations
        self.max_steps, self.client, self.invalid, self.render_mode = max_steps, client, invalid, render_mode
        self.step_timeout_s, self.episode_timeout_s = step_timeout_s, episode_timeout_s
        self.observation_space = spaces.Dict({"text": spaces.Text(OBS_MAX, min_length=1, charset=PRINTABLE)})
        self.action_space = self._action_space()
        self._backend: _Local | _Remote | None = None
        self._text = ""
        self.last: DrumsObservation | None = None
        self.last_attempt: str | None = None  # RUN_ID/SEQ in the ledger of the last finished attempt

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        pick = int(self.np_random.integers(0, 2**31 - 1))
        task = (options or {}).get("task")
        obs = self._get_backend().reset(seed=pick, task=task, client=self.client, policy="gym agent")
        self._text = printable(self._intro(obs)) + self._render_obs(obs)
        return self._observe(obs, self._text)

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._backend is None or self.last is None:
            raise RuntimeError("reset the environment before step")
        obs = self._get_backend().step(self._action(action))
        self._text = self._render_obs(obs)
        observation, info = self._observe(obs, self._text)
        if not obs.done:
            return observation, 0.0, False, False, info
        if obs.valid is False:
            if self.invalid == "raise":
                raise InvalidEpisode(info)
            return observation, math.nan, True, False, info
        truncated = obs.outcome == "failed" and obs.detail.startswith("truncated")
        return observation, float(obs.reward or 0.0), not truncated, truncated, info

    def render(self) -> str | None:
        return self._text if self.render_mode == "ansi" else None

    def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    # -- helpers --------------------------------------------------------------------------------
    def _action_space(self) -> spaces.Dict:
        return flat_space(self.actions, text_max=self.text_max)

    def _get_backend(self) -> _Local | _Remote:
        if self._backend is None:
            self._backend = _Remote(self.url) if self.url else _Local(
                self.substrate, self.tasks, self.out, self.max_steps, self.step_timeout_s, self.episode_timeout_s)
        return self._backend

    def _action(self, action: dict[str, Any]) -> DrumsAction:
        """The request a gymnasium action stands for (``ActionSet.from_slots``): ``kind`` an index
        of ``action_space`` or a name, each field from its slot or under its own name."""
        kind = action.get("kind", "submit")
        if isinstance(kind, np.integer):
            kind = int(kind)
        values = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in action.items() if k != "kind"}
        name, payload = self.actions.from_slots(kind, values)
        return DrumsAction(kind=name, args=payload, generation=self.last.generation if self.last else None)

    @staticmethod
    def _render_obs(obs: DrumsObservation) -> str:
        """The error of the last request, the observation's text (its kind's rendering) and, at the
        end, the outcome."""
        parts = [f"[error] {obs.error}"] if obs.error else []
        if obs.text:
            parts.append(obs.text)
        if obs.done:
            parts.append(f"[episode over: {obs.outcome}{' (' + obs.cause + ')' if obs.cause else ''}] {obs.detail}")
        return printable("\n".join(parts) or "[no output]")

    def _observe(self, obs: DrumsObservation, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
        self.last = obs
        if obs.done:
            self.last_attempt = obs.attempt
        info: dict[str, Any] = {"outcome": obs.outcome, "cause": obs.cause, "valid": obs.valid, "task": obs.task,
                                "step": obs.step}
        if obs.done:
            info["detail"] = obs.detail
        return self._observation(obs, text[:OBS_MAX] or "[no output]"), info

    def _observation(self, obs: DrumsObservation, text: str) -> dict[str, Any]:
        return {"text": text}

    def _intro(self, obs: DrumsObservation) -> str:
        first = self.observations.first
        return f"Task: {obs.description}\n" + (f"\n{first}\n" if first else "")


class ScreenEnv(KindEnv):
    """Episodes of a kind with a screen (``ObservationModel.screen_field``): ``DrumsBench/Desktop-v0``,
    LibreOffice under a real X server (docs/desktop.md), and ``DrumsBench/Env-v0`` on such a suite.

    Observation ``Dict(screen=Box(H, W, 3) uint8, title=Text, text=Text)`` (``text``: the goal at
    reset, then errors, a shell action's output and the end). Action (``flat_space``)
    ``Dict(kind=Discrete(10): key, type, click, double_click, drag, scroll, move, wait, shell,
    submit; text=Text: the keys, the text typed or the command; x, y, x2, y2=Discrete: pixels (a
    drag from x, y to x2, y2); dy=Discrete(21, start=-10): scroll clicks)``; dicts with a string
    ``kind`` and the desktop's own argument names (``keys``, ``x1``, ...) too.
    Declared nondeterministic: a live GUI (a blinking cursor, timing) does not repeat pixel for pixel.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 4}  # noqa: RUF012 - gymnasium's own
    text_max = 256

    def __init__(self, *, tasks: str = "desktop", width: int = 1280, height: int = 800,
                 render_mode: str | None = None, **kw: Any) -> None:
        if render_mode not in (None, "rgb_array"):
            raise UsageError(f"render_mode: {render_mode!r}; only rgb_array")
        self.width, self.height = width, height
        super().__init__(tasks=tasks, **kw)
        self.render_mode = render_mode
        self._screen = np.zeros((height, width, 3), dtype=np.uint8)
        self.observation_space = spaces.Dict({
            "screen": spaces.Box(0, 255, (height, width, 3), dtype=np.uint8),
            "title": spaces.Text(512, min_length=0, charset=PRINTABLE),
            "text": spaces.Text(OBS_MAX, min_length=1, charset=PRINTABLE)})

    def _action_space(self) -> spaces.Dict:
        return flat_space(self.actions, text_max=self.text_max, width=self.width, height=self.height)

    def render(self) -> Any:
        return self._screen.copy() if self.render_mode == "rgb_array" else None

    def _observation(self, obs: DrumsObservation, text: str) -> dict[str, Any]:
        if obs.screenshot_png:
            from PIL import Image  # comes with the serve extra (gradio)

            with Image.open(io.BytesIO(base64.b64decode(obs.screenshot_png))) as img:
                screen = np.asarray(img.convert("RGB"), dtype=np.uint8)
            if screen.shape == self._screen.shape:
                self._screen = screen
        return {"screen": self._screen.copy(), "title": printable(obs.title or "")[:512], "text": text}


def make_env(*, tasks: str, **kw: Any) -> KindEnv:
    """``DrumsBench/Env-v0``: the environment of the suite ``tasks``, of whatever kind —
    ``ScreenEnv`` when its observations have a screen, ``KindEnv`` otherwise."""
    screen = environment_class(suite_kind(tasks)).observations.screen_field is not None
    return (ScreenEnv if screen else KindEnv)(tasks=tasks, **kw)


CodingEnv = KindEnv  # the names of DrumsBench/Coding-v0 and Desktop-v0's classes before kinds were generic
DesktopEnv = ScreenEnv

gym.register(id="DrumsBench/Coding-v0", entry_point="drumsbench.gym:KindEnv")
gym.register(id="DrumsBench/Desktop-v0", entry_point="drumsbench.gym:ScreenEnv", nondeterministic=True)
gym.register(id="DrumsBench/Env-v0", entry_point="drumsbench.gym:make_env")

__all__ = ["CodingEnv", "DesktopEnv", "InvalidEpisode", "KindEnv", "ScreenEnv", "make_env", "printable"]
