"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (tests of the endpoint policy).

The model name picks the behaviour:
- ``oracle``: tool calls that follow the task's oracle plan (found from the task text in the prompt);
- ``flaky-oracle``: first an answer with no tool call, then the oracle's plan;
- ``rate-limited`` (429), ``broken`` (500), ``unauthorized`` (401), ``too-long`` (400);
- ``slow``: answers after ``SLOW_S`` seconds;
- ``no-tool``, ``unknown-tool``, ``bad-args``: well-formed answers that are not valid actions;
- ``args-object``, ``name-list``: a tool call whose arguments are an object or whose name is a list
  (the model's malformed step); ``usage-string``, ``choices-object``: an envelope that is not a chat
  completion's (token counts that are not numbers, choices that are not a list: the endpoint's);
- ``not-json``: a 200 whose body is not JSON.
``requests[model]`` counts the requests each model received (the client's retries included).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drumsbench.envs import suites

SLOW_S = 3.0


class LoopbackOpenAI:
    def __init__(self, tasks: str = "coding") -> None:
        self.tasks = {t.description: t for t in suites.load(tasks).tasks}  # ``oracle`` follows their plans
        self.requests: Counter[str] = Counter()
        self.tools: set[str] = set()  # the names of every tool offered in any request
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                outer.requests[body["model"]] += 1
                outer.tools |= {t["function"]["name"] for t in body.get("tools") or []}
                status, headers, payload = outer.answer(body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in {"content-type": "application/json", **headers}.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers ------------------------------------------------------------------------------
    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        model = body["model"]
        fast_retry = {"retry-after-ms": "10"}
        if model == "rate-limited":
            return 429, fast_retry, {"error": {"message": "rate limited", "type": "rate_limit"}}
        if model == "broken":
            return 500, fast_retry, {"error": {"message": "internal error", "type": "server_error"}}
        if model == "unauthorized":
            return 401, {}, {"error": {"message": "bad key", "type": "auth"}}
        if model == "too-long":
            return 400, {}, {"error": {"message": "context length exceeded", "type": "invalid_request_error"}}
        if model == "not-json":
            return 200, {}, b"<html>gateway</html>"
        if model == "slow":
            time.sleep(SLOW_S)
        messages = body["messages"]
        turns = sum(1 for m in messages if m["role"] == "assistant")
        if model == "no-tool" or (model == "flaky-oracle" and turns == 0):
            return 200, {}, self._completion(model, content="Let me think about it.")
        if model == "unknown-tool":
            return 200, {}, self._completion(model, call=("rm_everything", "{}"))
        if model == "bad-args":
            return 200, {}, self._completion(model, call=("shell", "{not json"))
        if model == "args-object":  # arguments as an object, not the JSON string the API promises
            return 200, {}, self._completion(model, call=("shell", {"command": "ls"}))
        if model == "name-list":
            return 200, {}, self._completion(model, call=(["shell"], "{}"))
        if model == "usage-string":
            return 200, {}, {**self._completion(model, call=("shell", '{"command": "ls"}')),
                             "usage": {"prompt_tokens": "many", "completion_tokens": 20}}
        if model == "choices-object":
            return 200, {}, {**self._completion(model, call=("shell", '{"command": "ls"}')), "choices": {"0": {}}}
        task = self.tasks[messages[1]["content"].removeprefix("Task: ")]
        plan = task.oracle_plan()
        i = turns - (1 if model == "flaky-oracle" else 0)
        spec = plan[i] if i < len(plan) else plan[-1]
        return 200, {}, self._completion(model, call=(spec.kind, json.dumps(spec.payload)))

    @staticmethod
    def _completion(model: str, content: str | None = None, call: tuple[Any, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if call is not None:
            message["tool_calls"] = [{"id": f"call_{time.monotonic_ns()}", "type": "function",
                                      "function": {"name": call[0], "arguments": call[1]}}]
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
