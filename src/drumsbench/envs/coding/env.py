"""The coding environment: a repository in the sandbox's work folder, shell actions, a test verifier.

Actions: ``shell`` {command}, ``write`` {path, content}, ``patch`` {patch} (``git apply``),
``submit``. Observations: {exit_code, stdout, stderr, truncated}.

Framing (``envs/shell_framing.py``): the policy's command runs in a child shell, the harness's outer
shell prints an end marker after it; a missing marker is a transport fault only with evidence.

Verification. ``judge`` (the default, ``VERIFIERS``): the **trusted judge** decides — the hidden
tests run on the host in ``judge.py`` (forked by the kept judge, ``judge_host``), a process the
policy's code never runs in; the code under test runs in ``boundary_server.py`` in the sandbox, as
the sandbox's uid, started after ``end_processes`` through the sandbox's ``Streaming`` capability, and
only plain data crosses back (docs/attribution.md). The hidden tests never enter the sandbox. Where
the sandbox cannot stream (``Streaming``) or the task declares ``verifier = "in-process"``, the
verdict is the in-process runner's, and ``verify_note["trust"]`` says so (``in-process``): every
report counts verdicts per trust level.

In-process: ``verify_runner.py`` (see its docstring) prints a verdict authenticated with a
per-verification secret handed over on stdin; the code under test never holds it, but runs in the
process that decides (its fences can be outwitted: issue 29's three classes). ``kept`` — where the sandbox keeps helpers
(``Helpers``), one verifier server per sandbox, started at reset before the policy's first action
as the harness's uid, out of the policy's reach, forks a worker per verification (elsewhere:
``warm``); ``warm`` — one interpreter per verification that does the imports, then forks the
child that runs the tests; ``cold`` — two interpreters, the child started afresh
(docs/warm-verifier.md). ``warm`` and ``cold`` start only after ``end_processes``: nothing of the
policy runs when they do; the kept server runs throughout, and nothing of the policy can reach it.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import signal
from pathlib import Path
from typing import Any

from drumsbench.core.errors import InvalidAttempt, MissingDependency, PolicyFault, SubstrateError, UsageError
from drumsbench.core.fingerprint import EMPTY_TREE
from drumsbench.core.outcome import InvalidCause
from drumsbench.core.verdict_channel import authentic_verdict, new_secret, runner_source, saw_ready
from drumsbench.envs.base import Action, Environment, Observation, VerifierNotes, VerifierResult
from drumsbench.envs.coding.actions import ACTIONS, INSTRUCTIONS
from drumsbench.envs.coding.judge_host import run_judge
from drumsbench.envs.coding.observation import CodingObservation
from drumsbench.envs.coding.server_zygote import ServerZygote
from drumsbench.envs.coding.task import CodingTask
from drumsbench.envs.shell_framing import OBS_LIMIT, command_content, framed_shell, lost_problem
from drumsbench.substrates.base import ExecResult, Helper, Helpers, SandboxPaths, Stream, Streaming

RUNNER = runner_source(Path(__file__).parent / "verify_runner.py")
# Seconds of the verifier's limit kept for the runner to report after the code under test is stopped.
VERIFY_MARGIN_S = 2.0


# How the verifier runs: "kept" asks a server kept in the sandbox since reset (where the sandbox
# keeps helpers; else "warm"), "warm" forks the child from an interpreter prepared per
# verification, "cold" starts it afresh.
VERIFIERS = ("judge", "kept", "warm", "cold")
DEFAULT_VERIFIER = "judge"
# verify_note["trust"]: who decided the verdict
TRUST_JUDGE = "judge"
TRUST_IN_PROCESS = "in-process"
# The boundary server's source, run with -c (never a file of the sandbox: nothing to trust there
# anyway, but nothing to stage either).
BOUNDARY_SERVER = (Path(__file__).parent / "boundary_server.py").read_text()
# The process-wide choice when the environment is made without one (run, sweep, serve, gym).
VERIFIER_VAR = "DRUMSBENCH_VERIFIER"


def runner_stdin(secret: bytes, config: dict[str, Any]) -> bytes:
    """What a verifier runner reads on stdin: the secret (hex), then the JSON config, a line each."""
    return secret.hex().encode() + b"\n" + json.dumps(config).encode() + b"\n"


def _during(verdict: dict[str, object]) -> str:
    """Where the judge was when the server was lost: ``, during <test id>`` or at import."""
    where = verdict.get("during")
    return f", during {where}" if where else ""


def task_modules(task: CodingTask) -> set[str]:
    """The top-level names the task's own files provide (imported through the boundary)."""
    return {rel.split("/")[0].removesuffix(".py") for rel in task.files}


def chosen_verifier(verifier: str | None = None) -> str:
    """``verifier``, else ``$DRUMSBENCH_VERIFIER``, else ``warm``; ``UsageError`` for another value."""
    value = verifier if verifier is not None else os.environ.get(VERIFIER_VAR, DEFAULT_VERIFIER)
    if value not in VERIFIERS:
        where = "verifier" if verifier is not None else VERIFIER_VAR
        raise UsageError(f"{where}={value!r}: give one of {', '.join(VERIFIERS)}")
    return value


class CodingEnv(Environment[CodingTask], VerifierNotes):
    kind = "coding"
    actions = ACTIONS
    observations = CodingObservation
    instructions = INSTRUCTIONS

    def __init__(self, verifier: str | None = None) -> None:
        super().__init__()
        self.verifier = chosen_verifier(verifier)
        # warm verifications that gave no authenticated READY and were run again cold (each with
        # the reason); the verdict is then the cold one's
        self.fallbacks: list[str] = []
        self.verify_note: dict[str, object] = {}
        # the kept verifier server of the attached sandbox (``kept``; None: it keeps none)
        self._server: Helper | None = None
        self._server_box: object | None = None
        # the boundary server's zygote in the attached sandbox (where it keeps helpers)
        self._zygote: ServerZygote | None = None
        # the judge's interpreter when fault injection broke it (None: the kept judge)
        self._judge_python: str | None = None

    def reset(self, task: CodingTask) -> None:
        super().reset(task)
        if self._in_process_verifier(task) == "kept":
            self._keep_server()
        elif self.judged(task) is None:
            self._keep_zygote()

    def release(self) -> None:
        """Stop the boundary server's zygote and the kept verifier server (their sockets, pipes and
        pidfds are the harness's until then)."""
        zygote, self._zygote = self._zygote, None
        server, self._server, self._server_box = self._server, None, None
        if zygote is not None:
            zygote.stop()
        if server is not None:
            server.stop()

    def _keep_zygote(self) -> None:
        """Start the boundary server's zygote in the attached sandbox where it keeps helpers, unless
        one runs there already (``server_zygote``); elsewhere each verification starts a server."""
        box = self.box
        if self._zygote is not None and self._zygote.box is box and self._zygote.alive():
            return
        if self._zygote is not None:
            self._zygote.stop()
        self._zygote = None
        if isinstance(box, Helpers):
            with contextlib.suppress(SubstrateError):
                self._zygote = ServerZygote(box)

    def judged(self, task: CodingTask) -> str | None:
        """None when the trusted judge decides ``task`` in the attached sandbox; else why not."""
        if task.trust == TRUST_IN_PROCESS:
            return "the task declares verifier = \"in-process\""
        if self.verifier != "judge":
            return f"verifier {self.verifier} chosen"
        if not isinstance(self.box, Streaming):
            return f"the {self.box.substrate} substrate cannot stream a command (no Streaming)"
        return None

    def _in_process_verifier(self, task: CodingTask) -> str | None:
        """The in-process runner that decides ``task`` (None: the judge does)."""
        if self.judged(task) is None:
            return None
        return "kept" if self.verifier in ("judge", "kept") else self.verifier

    def _keep_server(self) -> None:
        """Start the kept verifier server in the attached sandbox unless one runs there already.
        Called at reset, after the start state is written and before the policy's first action."""
        box = self.box
        if self._server is not None and self._server_box is box and self._server.alive():
            return
        self._server, self._server_box = None, box
        if isinstance(box, Helpers):
            with contextlib.suppress(SubstrateError):  # it cannot keep one here: the warm runner decides
                self._server = box.start_helper(self._server_argv(box.paths, box.helper_uid), cwd=box.paths.root)

    def _server_argv(self, paths: SandboxPaths, uid: int) -> list[str]:
        """The kept server's command line: the runner's source itself (never a file of the sandbox,
        which the policy could change before the interpreter reads it)."""
        return ["python3", "-I", "-c", RUNNER.decode(), "--serve", paths.verify, paths.work, str(uid)]

    def _write_start(self, task: CodingTask) -> None:
        self.box.put_files(self.box.paths.work, task.files)

    def fingerprint(self) -> str:
        """The work tree's digest; home and tmp must be empty (the policy can write them too)."""
        p = self.box.paths
        for folder in (p.home, p.tmp):
            if self.box.tree_digest(folder) != EMPTY_TREE:
                return f"not empty: {folder}"
        return self.box.tree_digest(p.work)

    def capture(self) -> dict[str, Any]:
        """A coding state is its work tree (the shell keeps no state between actions)."""
        return {"files": self.box.tree_digest(self.box.paths.work)}

    # -- observations ------------------------------------------------------------------------
    def _shell(self, command: str, timeout: float) -> Observation:
        content, timed_out = framed_shell(self.box, command, self.generation, self.step_count, timeout)
        return Observation(self.generation, self.step_count, content, timed_out=timed_out)

    def observe(self, timeout: float) -> Observation:
        return self._shell("find . -type f | sort | head -200", timeout)

    def observation_problem(self, obs: Observation) -> str | None:
        return lost_problem(obs.content)

    # -- actions -----------------------------------------------------------------------------
    def _result(self, code: int, stderr: str) -> Observation:
        content = {"exit_code": code, "stdout": "", "stderr": stderr, "truncated": False}
        return Observation(self.generation, self.step_count, content)

    def _run(self, argv: list[str], timeout: float, stdin: bytes) -> Observation:
        res = self.box.exec(argv, timeout=timeout, stdin=stdin, output_limit=OBS_LIMIT)
        return Observation(self.generation, self.step_count, command_content(res), timed_out=res.timed_out)

    def _apply(self, action: Action, timeout: float) -> Observation:
        p = action.payload
        if action.kind == "shell":
            return self._shell(str(p["command"]), timeout)
        if action.kind == "write":
            rel = posixpath.normpath(str(p["path"]))
            if rel.startswith(("/", "..")):
                return self._result(1, f"refused path {rel}: give a path inside the work folder")
            # Written by a command in the sandbox (its uid, its view of links), never by a host-side
            # write that a link planted by the policy could turn into a substrate error.
            return self._run(["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write", rel],
                             timeout, stdin=str(p["content"]).encode())
        if action.kind == "patch":
            return self._run(["git", "apply", "--whitespace=nowarn", "-"], timeout, stdin=str(p["patch"]).encode())
        return self._result(2, f"unknown action {action.kind!r}")

    # -- verifier ----------------------------------------------------------------------------
    def stage_verifier(self, task: CodingTask) -> None:
        """End every process the policy left, then (in-process runners only) copy the runner and the
        hidden tests; the judge stages nothing in the sandbox."""
        self.box.end_processes()
        # What the policy left there (files, links) goes; nothing of the policy runs any more.
        self.box.empty_folder(self.box.paths.verify)
        if self._in_process_verifier(task) is None:
            return
        files = {"runner.py": RUNNER, **{f"tests/{name}": data for name, data in task.hidden.items()}}
        self.box.put_files(self.box.paths.verify, files)

    def break_verifier(self) -> None:
        """Fault injection: the judge's interpreter is gone for this environment's next
        verification (a fresh judge is started with a path that does not exist); the staged runner
        is damaged from the host and the kept server killed: no verifier can start."""
        self._judge_python = "/nonexistent/drumsbench-broken-python"
        self.box.write_file(f"{self.box.paths.verify}/runner.py", b"import json\nraise SystemExit(\n")
        if self._server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._server.pid, signal.SIGKILL)

    def _exec_runner(self, secret: bytes, config: dict[str, Any], timeout: float, *, warm: bool) -> ExecResult:
        verify = self.box.paths.verify
        argv = ["python3", "-I", f"{verify}/runner.py", *(["--warm"] if warm else []), verify]
        return self.box.exec(argv, timeout=timeout, output_limit=OBS_LIMIT, stdin=runner_stdin(secret, config))

    def run_verifier(self, task: CodingTask, timeout: float) -> VerifierResult:
        """Passed, or failed with the reason (the tests ran and did not pass; evidence: the verdict's
        counts). ``PolicyFault`` when the code under test ended the verification itself or left the
        sandbox unusable (reason recorded); ``MissingDependency`` when a hidden
        test needs a module the sandbox lacks; ``InvalidAttempt(verifier_unavailable)`` only with
        evidence that the runner did not get to run the tests or to report (its authenticated
        READY missing, no tests defined) or that the sandbox itself failed (see ``Sandbox.probe``)."""
        why_not = self.judged(task)
        if why_not is None:
            return self._run_judge(task, timeout)
        if task.hidden_style == "pytest":
            # (the in-process runner knows unittest only: the harness's choice, never the policy's)
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"the hidden tests are pytest's, which only "
                                 f"the trusted judge runs, and the judge cannot decide here: {why_not}")
        try:
            return self._run_in_process(task, timeout)
        finally:
            self.verify_note = {**self.verify_note, "trust": TRUST_IN_PROCESS, "trust_why": why_not}

    def _run_judge(self, task: CodingTask, timeout: float) -> VerifierResult:
        """``run_verifier`` by the trusted judge (the module docstring; docs/attribution.md)."""
        assert isinstance(self.box, Streaming)
        secret = new_secret()
        config = {"tests": {name.rsplit("/", 1)[-1]: data.decode() for name, data in task.hidden.items()},
                  "task_modules": sorted(task_modules(task)), "limit_s": max(1.0, timeout - VERIFY_MARGIN_S)}
        self.verify_note = {"verifier": "judge", "trust": TRUST_JUDGE}
        zygote = self._zygote if self._zygote is not None and self._zygote.serves(self.box) else None
        stream: Stream | None = zygote.open() if zygote is not None and zygote.alive() else None
        self.verify_note["server"] = "zygote" if stream is not None else "started"
        if stream is None:
            stream = self.box.open_stream(["python3", "-I", "-c", BOUNDARY_SERVER], cwd=self.box.paths.work)
        try:
            lines, timed_out, how = run_judge(stream, secret, config, timeout, python=self._judge_python)
            server_exit = stream.poll()
        finally:
            stream.close()
            self._judge_python = None
        self.verify_note["judge"] = how
        if not saw_ready(lines, secret):
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"the judge did not start ({how}{', timed out' if timed_out else ''})")
        verdict = authentic_verdict(lines, secret)
        if verdict is None:
            if timed_out:
                # The judge's own work between the code under test's answers is bounded by the
                # hidden tests (which passed the oracle); what made it run past the limit came from
                # those answers.
                raise PolicyFault(f"the judge ran past {timeout:g} s on the code under test's answers", destroy=True)
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"the judge gave no verdict ({how})")
        self.verify_note["judge_calls"] = verdict.get("calls")
        status = verdict.get("status")
        reason = str(verdict.get("reason") or "")
        if status == "passed":
            return VerifierResult.success(**_counts(verdict))
        if status == "failed":
            return VerifierResult.failed(f"verifier: {reason or 'tests did not pass'}", **_counts(verdict))
        if status == "server_lost":
            evidence = self.box.probe()
            if evidence:
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"{reason}: {evidence}")
            ended = "" if server_exit is None else f" (exit {server_exit})"
            raise PolicyFault(f"verifier: {reason}{ended}{_during(verdict)}", destroy=True)
        # no_tests (a broken task), missing_dependency (the judge's own Python lacks a module the
        # hidden tests import: the policy cannot touch it), anything else: the judge's side
        raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"judge: {status}: {reason}")

    def _run_in_process(self, task: CodingTask, timeout: float) -> VerifierResult:
        """``run_verifier`` by an in-process runner (``verify_runner.py``)."""
        secret = new_secret()
        config = {"tests": sorted(task.hidden), "limit_s": max(1.0, timeout - VERIFY_MARGIN_S),
                  "task_modules": sorted(task_modules(task)),
                  "test_imports": sorted(task.test_imports)}
        chosen = self._in_process_verifier(task)
        server = self._server if chosen == "kept" and self._server_box is self.box else None
        if server is not None and server.alive():  # (not alive: it was started and has ended)
            self.verify_note = {"verifier": "kept"}
            res = server.call(b"go\n" + runner_stdin(secret, config), timeout=timeout, output_limit=OBS_LIMIT)
            lines = res.stdout.decode(errors="replace").splitlines()
            if saw_ready(lines, secret) or res.timed_out:
                return self._decide(task, res, lines, secret, timeout)
            why = f"kept server exit {res.exit_code}: {res.stdout.decode(errors='replace')[-120:]}"
            self.fallbacks.append(why)
            self.verify_note = {"verifier": "warm", "verifier_fallback": why}
            secret = new_secret()
        elif server is not None:
            # started at reset, ended since (killed from the host, or out of memory)
            why = "the kept server had ended"
            self.fallbacks.append(why)
            self.verify_note = {"verifier": "warm", "verifier_fallback": why}
        else:
            self.verify_note = {"verifier": "warm" if chosen == "kept" else str(chosen)}
        warm = chosen != "cold"
        res = self._exec_runner(secret, config, timeout, warm=warm)
        lines = res.stdout.decode(errors="replace").splitlines()
        if warm and not saw_ready(lines, secret) and not res.timed_out:
            # The warm runner could not start its child (nothing of the policy ran yet): the cold
            # runner decides, under today's rules, with a fresh secret.
            why = f"warm runner exit {res.exit_code}: {res.stderr.decode(errors='replace')[-120:]}"
            self.fallbacks.append(why)
            self.verify_note = {"verifier": "cold", "verifier_fallback": why}
            secret = new_secret()
            res = self._exec_runner(secret, config, timeout, warm=False)
            lines = res.stdout.decode(errors="replace").splitlines()
        return self._decide(task, res, lines, secret, timeout)

    def _decide(self, task: CodingTask, res: ExecResult, lines: list[str], secret: bytes,
                timeout: float) -> VerifierResult:
        """The verdict of one runner's output (``run_verifier``'s contract)."""
        err = (res.stderr or res.stdout).decode(errors="replace")[-200:]
        if not saw_ready(lines, secret):
            if res.timed_out:
                evidence = self.box.probe()
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                     f"verifier did not start within {timeout:g} s ({evidence or 'sandbox alive'})")
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"verifier did not start (exit {res.exit_code}): {err}")
        verdict = authentic_verdict(lines, secret)
        if verdict is None:
            # The runner started; the code under test ran in its child. Only the sandbox's own state
            # can make this infrastructure.
            evidence = self.box.probe()
            if evidence:
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"verifier gave no verdict: {evidence}")
            raise PolicyFault(f"the verifier gave no verdict after the code under test ran "
                              f"(exit {res.exit_code}{', timed out' if res.timed_out else ''})", destroy=True)
        status = verdict.get("status")
        if status == "passed":
            return VerifierResult.success(**_counts(verdict))
        if status == "no_tests":
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, str(verdict.get("reason")))
        if status == "missing_dependency":
            module = str(verdict.get("module"))
            if module not in task.test_imports:
                # The runner names only modules of the harness's list; anything else came from the
                # code under test (the report channel is in its process): its own failure.
                return VerifierResult.failed(f"verifier: the code under test reported a missing module {module!r} "
                                             "that no hidden test imports")
            raise MissingDependency(module, str(verdict.get("reason")))
        return VerifierResult.failed(f"verifier: {verdict.get('reason') or 'tests did not pass'}", **_counts(verdict))


def _counts(verdict: dict[str, object]) -> dict[str, int]:
    """The counts a verdict carries (tests expected, run, passed, ...): the result's evidence."""
    return {k: v for k, v in verdict.items() if type(v) is int and k != "calls"}
