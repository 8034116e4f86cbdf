"""The coding environment: a repository in the sandbox's work folder, shell actions, a test verifier.

Actions: ``shell`` {command}, ``write`` {path, content}, ``patch`` {patch} (``git apply``),
``submit``. Observations: {exit_code, stdout, stderr, truncated}. Every command's output ends with
an end marker that names the generation and step; an observation whose marker did not arrive
(the output channel broke) is unusable (``bad_observation``).
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

from drumsbench.envs.base import Action, Environment, Observation, Task
from drumsbench.envs.coding.task import CodingTask
from drumsbench.errors import InvalidAttempt
from drumsbench.outcome import InvalidCause

RUNNER = (Path(__file__).parent / "verify_runner.py").read_bytes()
OBS_LIMIT = 16 * 1024
# The end marker is printed by an EXIT trap, so it follows the command even when the command
# calls `exit`, at no extra fork. A command that replaces the shell (`exec prog`) loses it and is
# reported as a bad observation: invalid, never reward 0.
_WRAP = 'trap \'s=$?; {BREAK}printf "\\n%s %d\\n" "$2" "$s"\' EXIT; eval "$1"'


class CodingEnv(Environment):
    kind = "coding"

    def __init__(self) -> None:
        super().__init__()
        self._break_next = False

    def _write_start(self, task: Task) -> None:
        assert isinstance(task, CodingTask)
        self.box.put_files(self.box.paths.work, task.files)

    def fingerprint(self) -> str:
        return self.box.tree_digest(self.box.paths.work)

    def capture(self) -> dict[str, Any]:
        """A coding state is its work tree (the shell keeps no state between actions)."""
        return {"files": self.box.tree_digest(self.box.paths.work)}

    # -- observations ------------------------------------------------------------------------
    def _shell(self, command: str, timeout: float) -> Observation:
        marker = f"__DRUMSBENCH_END_{self.generation}_{self.step_count}__"
        wrap = _WRAP.replace("{BREAK}", "exec 1>&-; " if self._break_next else "")
        self._break_next = False
        res = self.box.exec(["/bin/sh", "-c", wrap, "drumsbench", command, marker], timeout=timeout,
                            output_limit=OBS_LIMIT)
        out = res.stdout
        tail = f"\n{marker} ".encode()
        cut = out.rfind(tail)
        content: dict[str, object] = {"stderr": res.stderr.decode(errors="replace"),
                                      "truncated": res.truncated}
        if cut >= 0 and not res.timed_out:
            content["exit_code"] = int(out[cut + len(tail):].strip() or b"-1")
            content["stdout"] = out[:cut].decode(errors="replace")
        else:
            content["exit_code"] = None
            content["stdout"] = out.decode(errors="replace")
        return Observation(self.generation, self.step_count, content, timed_out=res.timed_out)

    def observe(self, timeout: float) -> Observation:
        return self._shell("find . -type f | sort | head -200", timeout)

    def observation_problem(self, obs: Observation) -> str | None:
        if obs.content.get("exit_code") is None:
            return "the command's end marker never arrived: output channel lost"
        return None

    def break_observation_channel(self) -> None:
        self._break_next = True

    # -- actions -----------------------------------------------------------------------------
    def _result(self, code: int, stderr: str) -> Observation:
        content = {"exit_code": code, "stdout": "", "stderr": stderr, "truncated": False}
        return Observation(self.generation, self.step_count, content)

    def _apply(self, action: Action, timeout: float) -> Observation:
        p = action.payload
        if action.kind == "shell":
            return self._shell(str(p["command"]), timeout)
        if action.kind == "write":
            rel = posixpath.normpath(str(p["path"]))
            if rel.startswith(("/", "..")):
                return self._result(1, f"refused path {rel}: give a path inside the work folder")
            self.box.write_file(f"{self.box.paths.work}/{rel}", str(p["content"]).encode())
            return self._result(0, "")
        if action.kind == "patch":
            patch_path = f"{self.box.paths.tmp}/.drumsbench-{self.step_count}.patch"
            self.box.write_file(patch_path, str(p["patch"]).encode())
            return self._shell(f"git apply --whitespace=nowarn {patch_path} && rm -f {patch_path}", timeout)
        return self._result(2, f"unknown action {action.kind!r}")

    # -- verifier ----------------------------------------------------------------------------
    def stage_verifier(self, task: Task) -> None:
        assert isinstance(task, CodingTask)
        files = {"runner.py": RUNNER, **{f"tests/{name}": data for name, data in task.hidden.items()}}
        self.box.put_files(self.box.paths.verify, files)

    def break_verifier(self) -> None:
        self.box.write_file(f"{self.box.paths.verify}/runner.py", b"import json\nraise SystemExit(\n")

    def run_verifier(self, task: Task, timeout: float) -> bool:
        res = self.box.exec(["python3", f"{self.box.paths.verify}/runner.py", self.box.paths.verify],
                            timeout=timeout, output_limit=OBS_LIMIT)
        out = res.stdout.decode(errors="replace")
        err = res.stderr.decode(errors="replace")[-200:]
        if res.timed_out:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"verifier timed out after {timeout:g} s")
        if "DRUMSBENCH_VERIFIER_READY" not in out:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"verifier did not start (exit {res.exit_code}): {err}")
        for line in reversed(out.splitlines()):
            if line.startswith("DRUMSBENCH_VERDICT "):
                try:
                    return bool(json.loads(line.split(" ", 1)[1])["passed"])
                except (ValueError, KeyError) as e:
                    raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"unreadable verdict: {e}") from None
        raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                             f"verifier crashed before its verdict (exit {res.exit_code}): {err}")
