"""The endpoint policy: a model behind an OpenAI-compatible chat-completions endpoint.

``drumsbench run --policy endpoint --endpoint URL --model NAME`` (stored as the policy name
``endpoint:NAME@URL``). Each observation goes to the endpoint with the task's kind's actions as
tools (``Environment.actions``, typed models: coding's ``shell``, ``write``, ``patch``, ``submit``)
and the kind's ``instructions`` as the system prompt; the answer's tool call becomes the action.
The client is the real ``openai`` package (its own bounded retries with backoff).

Attribution (docs/attribution.md, the policy is an adversary):

- the endpoint unreachable, timing out, answering 429 or 5xx after the bounded retries, refusing
  the credentials or the model (401/403/404), or answering something that is not a chat
  completion: ``PolicyUnavailable`` -> ``invalid/policy_unavailable``. The evidence is outside the
  policy: the transport and the endpoint's own status, which no model output can produce;
- a well-formed answer that is not a valid action (no tool call, an unknown tool, arguments that
  are not JSON or lack a field) is the policy's own choice: a failed step the policy sees (the
  environment answers "unknown action", the next prompt says what was wrong), and the attempt goes
  on or fails (truncation at the step limit). A request the endpoint refuses as too large (400,
  413, 422: the episode's own context) is the policy's failure too;
- tokens and latency of every call are recorded in the ledger (``extra.inference``).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from drumsbench.core.errors import PolicyFault, PolicyUnavailable, UsageError
from drumsbench.envs.actions import ActionSet
from drumsbench.envs.base import Action, ActionSpec, Observation, Task
from drumsbench.envs.observations import ObservationModel
from drumsbench.envs.suites import environment_class
from drumsbench.policies.registry import PolicyArgs
from drumsbench.policies.scripted import Policy

PREFIX = "endpoint:"
OBS_CHARS = 6000

def policy_name(policy: str, endpoint: str | None, model: str | None) -> str:
    """The run's policy name for ``--policy endpoint --endpoint URL --model NAME``; UsageError naming
    the flag that is wrong."""
    if policy != "endpoint":
        if endpoint is not None:
            raise UsageError("--endpoint: only with --policy endpoint")
        if model is not None:
            raise UsageError("--model: only with --policy endpoint")
        return policy
    if not endpoint:
        raise UsageError("--endpoint: --policy endpoint needs the endpoint's base URL, e.g. http://127.0.0.1:8001/v1")
    if not endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint: {endpoint!r} is not an http(s) URL; e.g. http://127.0.0.1:8001/v1")
    if not model or not model.strip():
        raise UsageError("--model: --policy endpoint needs the model name the endpoint serves")
    return f"{PREFIX}{model.strip()}@{endpoint}"


def factory(args: PolicyArgs) -> EndpointPolicy:
    """The registry's factory: ``endpoint:MODEL@URL`` (``--policy endpoint --endpoint URL --model NAME``)."""
    if not args.arg:
        raise UsageError("--policy endpoint: give --endpoint URL and --model NAME")
    return parse(args.spec)


def parse(name: str) -> EndpointPolicy:
    """``endpoint:MODEL@URL`` -> the policy."""
    rest = name[len(PREFIX):]
    at = rest.rfind("@http")
    if at <= 0:
        raise UsageError(f"--policy: {name!r}: write --policy endpoint --endpoint URL --model NAME")
    return EndpointPolicy(rest[at + 1:], rest[:at])


class EndpointPolicy(Policy):
    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout_s: float | None = None,
                 retries: int | None = None, max_tokens: int = 2048, temperature: float = 0.0) -> None:
        super().__init__()
        try:
            import openai
        except ImportError as e:
            raise UsageError(f"--policy endpoint: needs the openai package (pip install 'drumsbench[serve]'): {e}") \
                from None
        self.url, self.model = url, model
        self.name = f"{PREFIX}{model}"
        env = os.environ
        self.timeout_s = timeout_s if timeout_s is not None else float(env.get("DRUMSBENCH_ENDPOINT_TIMEOUT", 120))
        self.retries = retries if retries is not None else int(env.get("DRUMSBENCH_ENDPOINT_RETRIES", 2))
        self.max_tokens, self.temperature = max_tokens, temperature
        self.openai = openai
        self.client = openai.OpenAI(base_url=url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=self.timeout_s, max_retries=self.retries)
        self.messages: list[dict[str, Any]] = []
        self.actions: ActionSet = ActionSet()  # the task's kind's, from ``begin``
        self.observations: type[ObservationModel] = ObservationModel  # the task's kind's, from ``begin``
        self.tools: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self._tool_call_id: str | None = None
        self._problem: str | None = None

    def plan(self, task: Task, rng: random.Random) -> list[ActionSpec]:
        return []

    def begin(self, task: Task, rng: random.Random) -> None:
        env_class = environment_class(task.env_kind)
        self.actions, self.tools = env_class.actions, env_class.actions.tools()
        self.observations = env_class.observations
        self.messages = [{"role": "system", "content": env_class.instructions},
                         {"role": "user", "content": f"Task: {task.description}"}]
        self.calls = []
        self._tool_call_id = None
        self._problem = None

    def notes(self) -> dict[str, object]:
        ok = [c for c in self.calls if "prompt_tokens" in c]
        return {"inference": {
            "endpoint": self.url, "model": self.model, "calls": len(self.calls),
            "prompt_tokens": sum(c["prompt_tokens"] for c in ok),
            "completion_tokens": sum(c["completion_tokens"] for c in ok),
            "latency_s": round(sum(c["latency_s"] for c in self.calls), 4),
            "steps": self.calls[:400]}}

    # -- one step ---------------------------------------------------------------------------------
    def _show(self, obs: Observation) -> str:
        """The observation as its kind renders it (``ObservationModel.text``), its middle cut past
        ``2 * OBS_CHARS`` characters; after a malformed answer, what was wrong first."""
        text = self.observations.of(obs).text() or "[no output]"
        if len(text) > 2 * OBS_CHARS:
            text = f"{text[:OBS_CHARS]}\n[... {len(text) - 2 * OBS_CHARS} characters cut ...]\n{text[-OBS_CHARS:]}"
        if self._problem:
            text = f"Your last answer was not a valid action: {self._problem}. Call exactly one tool.\n{text}"
        return text

    def act(self, obs: Observation) -> Action:
        shown = self._show(obs)
        if self._tool_call_id is not None:
            self.messages.append({"role": "tool", "tool_call_id": self._tool_call_id, "content": shown})
        else:
            self.messages.append({"role": "user", "content": shown})
        self._tool_call_id, self._problem = None, None
        answer = self._call()
        msg = answer.choices[0].message
        content = msg.content if isinstance(msg.content, str) else ""
        calls = msg.tool_calls if isinstance(msg.tool_calls, list) else []
        if not calls:
            self.messages.append({"role": "assistant", "content": content})
            return self._malformed(obs, "the answer called no tool")
        # What the model generated is read by type, never trusted to be what the API promises (the
        # client builds its objects without validating them): a wrong type is the model's malformed
        # step, which it is told about, never a Python error blamed on the infrastructure.
        call = calls[0]
        function = getattr(call, "function", None)
        call_id = getattr(call, "id", None)
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        call_id = call_id if isinstance(call_id, str) and call_id else f"call_{len(self.calls)}"
        shown_name = name if isinstance(name, str) else json.dumps(name, default=str)[:80]
        shown_args = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)[:2000]
        self.messages.append({"role": "assistant", "content": content, "tool_calls": [{
            "id": call_id, "type": "function", "function": {"name": shown_name, "arguments": shown_args}}]})
        self._tool_call_id = call_id
        model = self.actions.model(name) if isinstance(name, str) else None
        if model is None:
            return self._malformed(obs, f"unknown tool {shown_name}; the tools are {', '.join(self.actions.names)}")
        if arguments is not None and not isinstance(arguments, str):
            return self._malformed(obs, f"the arguments of {name} are not a JSON string "
                                        f"(a {type(arguments).__name__})")
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return self._malformed(obs, f"the arguments of {name} are not JSON ({e.msg})")
        if not isinstance(args, dict):
            return self._malformed(obs, f"the arguments of {name} are not a JSON object")
        problem = self.actions.problem(model.kind, args)
        if problem:
            return self._malformed(obs, problem)
        return Action(model.kind, obs.generation, {k: args[k] for k in model.model_fields if k in args})

    def _malformed(self, obs: Observation, problem: str) -> Action:
        """The policy's own failed step: the environment answers "unknown action", the next prompt
        says what was wrong. It counts against the step limit like any step."""
        self._problem = problem
        self.calls[-1]["problem"] = problem
        return Action(f"malformed: {problem}", obs.generation)

    def _call(self) -> Any:
        oa = self.openai
        t0 = time.monotonic()
        entry: dict[str, Any] = {"step": len(self.calls)}
        self.calls.append(entry)
        try:
            create: Any = self.client.chat.completions.create  # plain dicts, as the API takes them
            answer = create(model=self.model, messages=self.messages, tools=self.tools, max_tokens=self.max_tokens,
                            temperature=self.temperature)
        except oa.APIConnectionError as e:  # refused, unreachable, timed out (APITimeoutError) after retries
            raise self._unavailable(entry, t0, f"{type(e).__name__}: {e}") from None
        except oa.APIStatusError as e:
            code = e.status_code
            if code in (400, 413, 422):
                entry.update(latency_s=round(time.monotonic() - t0, 4), error=f"HTTP {code}")
                raise PolicyFault(f"the endpoint refused the request built from this episode (HTTP {code}: "
                                  f"{str(e)[:200]}), e.g. a context grown too long") from None
            raise self._unavailable(entry, t0, f"HTTP {code}: {str(e)[:200]}") from None
        except (oa.OpenAIError, ValueError) as e:  # an answer that is not a chat completion
            raise self._unavailable(entry, t0, f"{type(e).__name__}: {str(e)[:200]}") from None
        entry["latency_s"] = round(time.monotonic() - t0, 4)
        # The envelope is the endpoint's: one that is not a chat completion is the endpoint's fault
        # (policy_unavailable), whatever the client made of it.
        choices = getattr(answer, "choices", None)
        if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
            raise self._unavailable(entry, t0, "the answer is not a chat completion (no choices)")
        usage = getattr(answer, "usage", None)
        tokens = {k: getattr(usage, k, 0) if usage is not None else 0 for k in ("prompt_tokens", "completion_tokens")}
        bad = {k: v for k, v in tokens.items() if v is not None and (type(v) is not int or v < 0)}
        if bad:
            raise self._unavailable(entry, t0, "the answer's usage is not token counts: "
                                               + ", ".join(f"{k}={v!r}"[:60] for k, v in bad.items()))
        entry.update({k: v or 0 for k, v in tokens.items()})
        return answer

    def _unavailable(self, entry: dict[str, Any], t0: float, what: str) -> PolicyUnavailable:
        entry.update(latency_s=round(time.monotonic() - t0, 4), error=what[:300])
        return PolicyUnavailable(f"inference endpoint {self.url} ({self.model}) after {self.retries} retries: {what}")
