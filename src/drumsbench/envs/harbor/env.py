"""The ``harbor`` environment kind: Harbor task folders, each in a sandbox of its own image.

Reset: the rollout gives every attempt a fresh sandbox of the task's start image (``TaskImages``:
built by the substrate from the task's Dockerfile, ``RecipeImages``); nothing is written, and gate 1
checks that the working folder is the image's (digested against a reference sandbox of the same
image, made once per image and process) and the sandbox's own folders empty. Actions: ``shell``
(framed, ``envs/shell_framing.py``, run in the working folder as the container's user) and ``write``;
observations: exit status and output.

Verification, stricter than Harbor's (docs/harbor.md):

1. ``stage_verifier``: every process of the agent ends; the carried paths (the working folder and
   what the task declares) are archived by the agent's sandbox and checked on the host
   (``carry.clean_archive``: the agent's ``tar`` is not trusted); a **fresh sandbox of the verifier's
   pristine image** (separate mode's own, else the start image) is made; its pristine carried
   paths are removed and the agent's extracted by its own ``tar``; the tests are copied to
   ``/tests`` after that, ``/logs/verifier``
   made empty. Nothing else of the agent's sandbox travels: no system file, interpreter, ``/logs``,
   ``/tests``, background process or environment.
2. ``run_verifier``: the files that steer a test runner (``carry.STEERING``) in the carried paths,
   digested by the fresh sandbox's pristine ``python3`` (``-I -S``), are compared with those of the
   start image's reference sandbox (no policy ran there; separate mode's verifier image may hold none
   of them): a new or changed one -> failed with its name (before any test runs);
   ``/tests/test.sh`` started by ``bash`` (a start line with a nonce printed only once bash is there:
   no line -> the verifier could not start -> invalid ``verifier_unavailable``); killed by a signal
   -> failed (the code under test stopped it: a reward written before that is not counted); past its
   limit -> invalid with the verifier sandbox's own evidence (``probe``), else failed; then the
   reward as Harbor 0.26 reads it (``parse_reward``: ``/logs/verifier/reward.json`` first, else
   ``reward.txt``): success iff it is at least 1 (the value is kept as evidence); none, or not a
   number -> failed with the reason.

``verifier="harbor-shared"`` (or ``$DRUMSBENCH_HARBOR_VERIFIER``) verifies as Harbor 0.26's shared
mode does instead — test.sh in the agent's own container, its processes running, the reward file
read (``trust: agent-container``): the red team's positive control, never a way to train.

Trust: ``test.sh`` runs the agent's code in the verifier's sandbox (pytest imports it, a C task runs
its binary), which can write the reward file itself: the verdict is decided inside a process tree
the agent's code runs in, so ``verify_note["trust"]`` is ``in-process`` for every Harbor task, and
every report counts it. What the fresh sandbox removes is everything the agent could leave *outside*
its code: a pre-written reward, a replaced ``python3``/``pytest``/``bash``, a ``.pth`` or
``sitecustomize.py`` in the system, a planted ``conftest.py``, a background process, edited tests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import secrets
import threading

from drumsbench.core.errors import InvalidAttempt, PolicyFault, SubstrateError, UsageError
from drumsbench.core.fingerprint import EMPTY_TREE
from drumsbench.core.outcome import InvalidCause
from drumsbench.envs.base import Action, Environment, Observation, TaskImages, VerifierNotes, VerifierResult
from drumsbench.envs.harbor.actions import ACTIONS, INSTRUCTIONS, HarborObservation
from drumsbench.envs.harbor.carry import CARRY_LIMIT, CarryRefused, clean_archive, steering_argv
from drumsbench.envs.harbor.task import HarborTask
from drumsbench.envs.shell_framing import OBS_LIMIT, command_content, framed_shell, lost_problem
from drumsbench.substrates.base import ImageRecipe, RecipeImages, Sandbox, SandboxLimits, exec_as_root

REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
TRUST = "in-process"
TRUST_WHY = "test.sh runs the agent's code in the verifier's sandbox (Harbor's tests import or run it)"
# How the verifier runs: "fresh" (module docstring), or "harbor-shared", Harbor 0.26's shared mode
# (test.sh in the agent's own container with its processes running, the reward file read): the red
# team's positive control, never a way to train (docs/harbor.md)
VERIFIERS = ("fresh", "harbor-shared")
VERIFIER_VAR = "DRUMSBENCH_HARBOR_VERIFIER"
TRUST_SHARED = "agent-container"
TRUST_SHARED_WHY = "Harbor's shared mode: test.sh runs in the agent's own container, the reward file is read"
# test.sh is started by this: the nonce ($1) is printed only once bash is there to run it
START = 'command -v bash >/dev/null 2>&1 || exit 127; printf "%s\\n" "$1"; exec bash /tests/test.sh'

# What a reference sandbox of each start image holds, no policy having run in it: (substrate, image) ->
# (the working folder's digest, the steering files' digests in the carried paths)
_REFERENCE: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}
_REFERENCE_LOCK = threading.Lock()


def signalled(code: int) -> bool:
    """Did a process end by a signal (negative here; 128+N as container runtimes report it)?"""
    return code < 0 or 128 < code <= 128 + 64


def parse_reward(txt: bytes | None, js: bytes | None) -> float | str:
    """The reward as Harbor reads it (0.26: ``reward.json`` first, then ``reward.txt``), or why there
    is none (a sentence). Of a JSON object of several numbers, ``reward`` is the one that counts."""
    if js is not None:
        try:
            data = json.loads(js)
        except (UnicodeDecodeError, ValueError):
            return f"reward.json is not JSON: {js[:40]!r}"
        fields = data if isinstance(data, dict) else {"reward": data}
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in fields.values()):
            return f"reward.json holds a value that is not a number: {js[:60]!r}"
        numbers = [float(v) for v in fields.values()]
        if "reward" in fields:
            value = float(fields["reward"])
        elif len(numbers) == 1:
            value = numbers[0]
        else:
            return "reward.json has no 'reward' number"
    elif txt is not None:
        try:
            value = float(txt.decode().strip())
        except (UnicodeDecodeError, ValueError):
            return f"reward.txt is not a number: {txt[:40]!r}"
    else:
        return "test.sh wrote no reward (/logs/verifier/reward.txt or reward.json)"
    return value if math.isfinite(value) else f"the reward is {value}"


def chosen_verifier(verifier: str | None = None) -> str:
    """``verifier``, else ``$DRUMSBENCH_HARBOR_VERIFIER``, else ``fresh``; ``UsageError`` naming the
    setting for another value."""
    value = verifier if verifier is not None else os.environ.get(VERIFIER_VAR, "fresh")
    if value not in VERIFIERS:
        where = "verifier" if verifier is not None else VERIFIER_VAR
        raise UsageError(f"{where}={value!r}: give one of {', '.join(VERIFIERS)}")
    return value


class HarborEnv(Environment[HarborTask], TaskImages[HarborTask], VerifierNotes):
    kind = "harbor"
    actions = ACTIONS
    observations = HarborObservation
    instructions = INSTRUCTIONS

    def __init__(self, verifier: str | None = None) -> None:
        super().__init__()
        self.verifier = chosen_verifier(verifier)
        self.verify_note: dict[str, object] = {}
        self._images: RecipeImages | None = None
        self._run_limits = SandboxLimits()
        self._task: HarborTask | None = None
        self._verifier: Sandbox | None = None  # the staged verifier sandbox

    # -- images ----------------------------------------------------------------------------
    def start_image(self, task: HarborTask) -> ImageRecipe:
        return task.start_recipe

    def use_images(self, images: RecipeImages, run_limits: SandboxLimits) -> None:
        self._images = images
        self._run_limits = run_limits

    @property
    def images(self) -> RecipeImages:
        if self._images is None:
            raise SubstrateError("harbor: no substrate to make sandboxes of task images was handed over")
        return self._images

    def task_limits(self, task: HarborTask, run: SandboxLimits) -> SandboxLimits:
        """The run's bounds tightened by the task's ``[environment] memory_mb``, ``storage_mb`` and
        ``cpus`` (never loosened: the run's bounds protect the host)."""
        spec = task.spec
        return run.within(memory_mb=spec.memory_mb, disk_mb=spec.storage_mb, cpus=spec.cpus)

    def _fresh(self, recipe: ImageRecipe, task: HarborTask) -> Sandbox:
        """A sandbox of ``recipe``'s image under ``task``'s bounds (the verifier's, as the agent's)."""
        return self.images.create_from_image(self.images.build_recipe(recipe), self.task_limits(task, self._run_limits))

    def _reference(self, task: HarborTask) -> tuple[str, dict[str, str]]:
        """The working folder's digest and the steering files' digests in the carried paths, in a
        sandbox of the start image that no policy ever ran in (made once per image and process)."""
        image = self.images.build_recipe(task.start_recipe)
        key = (self.box.substrate, image)
        with _REFERENCE_LOCK:
            if key not in _REFERENCE:
                ref = self.images.create_from_image(image)
                try:
                    _REFERENCE[key] = (ref.tree_digest(task.workdir), self._steering_digests(ref, task))
                finally:
                    ref.destroy()
            return _REFERENCE[key]

    # -- the episode -----------------------------------------------------------------------
    def _write_start(self, task: HarborTask) -> None:
        self._task = task  # the image holds the start state: nothing to write

    def release(self) -> None:
        self._drop_verifier()

    def _drop_verifier(self) -> None:
        box, self._verifier = self._verifier, None
        if box is not None:
            box.destroy()

    @property
    def task(self) -> HarborTask:
        if self._task is None:
            raise RuntimeError("harbor environment: no task reset yet")
        return self._task

    def fingerprint(self) -> str:
        """The task's start fingerprint when the working folder digests as the image's and the
        sandbox's own folders are empty; else what differs."""
        p = self.box.paths
        for folder in (p.work, p.home, p.tmp):
            if self.box.tree_digest(folder) != EMPTY_TREE:
                return f"not empty: {folder}"
        task = self.task
        got = self.box.tree_digest(task.workdir)
        return task.start_fingerprint if got == self._reference(task)[0] else f"{task.workdir} differs: {got}"

    def canary_folders(self) -> list[str]:
        p = self.box.paths
        return [p.work, p.home, p.tmp, *([self._task.workdir] if self._task else [])]

    def _shell(self, command: str, timeout: float) -> Observation:
        content, timed_out = framed_shell(self.box, command, self.generation, self.step_count, timeout,
                                          cwd=self.task.workdir, env=self.task.spec.env)
        return Observation(self.generation, self.step_count, content, timed_out=timed_out)

    def observe(self, timeout: float) -> Observation:
        return self._shell("pwd; ls -la", timeout)

    def observation_problem(self, obs: Observation) -> str | None:
        return lost_problem(obs.content)

    def _apply(self, action: Action, timeout: float) -> Observation:
        p = action.payload
        if action.kind == "shell":
            return self._shell(str(p["command"]), timeout)
        if action.kind == "write":
            path = posixpath.join(self.task.workdir, str(p["path"]))
            # written by a command in the sandbox (its user, its view of links), never from the host
            res = self.box.exec(["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write", path],
                                timeout=timeout, stdin=str(p["content"]).encode(), cwd=self.task.workdir,
                                output_limit=OBS_LIMIT)
            return Observation(self.generation, self.step_count, command_content(res), timed_out=res.timed_out)
        content = {"exit_code": 2, "stdout": "", "stderr": f"unknown action {action.kind!r}", "truncated": False}
        return Observation(self.generation, self.step_count, content)

    # -- the verifier ----------------------------------------------------------------------
    def stage_verifier(self, task: HarborTask) -> None:
        """Step 1 of the module docstring. ``PolicyFault`` when the carried files are refused."""
        self._drop_verifier()
        if self.verifier == "harbor-shared":
            self._stage_shared(task)
            return
        self.verify_note = {"verifier": "fresh-sandbox", "trust": TRUST, "trust_why": TRUST_WHY,
                            "carried": list(task.carry)}
        self.box.end_processes()
        tops = [c.lstrip("/") for c in task.carry]
        res = self.box.exec(["tar", "-C", "/", "-cf", "-", "--ignore-failed-read", *tops], timeout=120,
                            cwd="/", output_limit=CARRY_LIMIT)
        if res.truncated:
            raise PolicyFault(f"the carried paths ({', '.join(task.carry)}) hold over {CARRY_LIMIT >> 20} MiB")
        try:
            archive = clean_archive(res.stdout, task.carry)
        except CarryRefused as e:
            raise PolicyFault(f"{e} (tar exit {res.exit_code}: {res.stderr.decode(errors='replace')[-160:]})") from None
        box = self._verifier = self._fresh(task.verifier_recipe, task)
        # the set-up is the harness's, as the sandbox's root whatever the image's USER (owners kept)
        exec_as_root(box, ["rm", "-rf", "--one-file-system", *task.carry], timeout=60, cwd="/")
        done = exec_as_root(box, ["tar", "-C", "/", "-xpf", "-"], timeout=120, cwd="/", stdin=archive)
        if done.exit_code != 0:
            raise SubstrateError(f"harbor: the verifier sandbox could not take the carried files "
                                 f"(tar exit {done.exit_code}: {done.stderr.decode(errors='replace')[-200:]})")
        exec_as_root(box, ["rm", "-rf", "/tests", "/logs/verifier"], timeout=60, cwd="/")
        box.put_files("/tests", task.tests)
        # writable by test.sh's user, as Harbor's host-mounted /logs is
        made = exec_as_root(box, ["sh", "-c", "mkdir -p /logs/verifier && chmod 0777 /logs/verifier"], timeout=30,
                            cwd="/")
        if made.exit_code != 0:
            raise SubstrateError(f"harbor: cannot make /logs/verifier in the verifier sandbox (exit {made.exit_code})")

    def _steering_digests(self, box: Sandbox, task: HarborTask) -> dict[str, str]:
        res = box.exec(steering_argv(task.carry), timeout=60, cwd="/", output_limit=4 * 1024 * 1024)
        if res.exit_code != 0:
            raise SubstrateError(f"harbor: the verifier sandbox's python3 could not list the test runner's files "
                                 f"(exit {res.exit_code}: {res.stderr.decode(errors='replace')[-200:]})")
        return dict(json.loads(res.stdout))

    def break_verifier(self) -> None:
        """Fault injection: ``bash`` is removed from the staged verifier sandbox (an image without
        the interpreter test.sh needs): test.sh cannot start."""
        box = self._verifier or (self.box if self.verifier == "harbor-shared" else None)
        if box is not None:
            exec_as_root(box, ["rm", "-f", "/usr/bin/bash", "/bin/bash"], timeout=30, cwd="/")

    def run_verifier(self, task: HarborTask, timeout: float) -> VerifierResult:
        """Step 2 of the module docstring."""
        if self.verifier == "harbor-shared":
            return self._run_shared(task, timeout)
        box = self._verifier
        if box is None:
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, "harbor: no verifier sandbox was staged")
        try:
            return self._verdict(box, task, timeout)
        finally:
            self._drop_verifier()

    def _verdict(self, box: Sandbox, task: HarborTask, timeout: float) -> VerifierResult:
        # compared with the start image's own (separate mode's verifier image may hold none of them)
        now, start = self._steering_digests(box, task), self._reference(task)[1]
        changed = sorted(p for p in set(now) | set(start) if now.get(p) != start.get(p))
        if changed:
            more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
            return VerifierResult.failed(f"verifier: files that steer the test runner are new or changed: "
                                         f"{', '.join(changed[:3])}{more}", steering_changed=len(changed))
        nonce = secrets.token_hex(8)
        res = box.exec(["/bin/sh", "-c", START, "start", nonce], timeout=timeout, cwd=task.workdir,
                       env=task.spec.env, output_limit=OBS_LIMIT)
        started = nonce in res.stdout.decode(errors="replace").splitlines()[:1]
        self.verify_note["test_exit"] = res.exit_code
        if not started:
            gone = box.probe() if res.timed_out else None
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE,
                                 f"test.sh could not start (exit {res.exit_code}"
                                 f"{', timed out: ' + (gone or 'sandbox alive') if res.timed_out else ''}): "
                                 f"{res.stderr.decode(errors='replace')[-160:]}")
        if res.timed_out:
            gone = box.probe()
            if gone:
                raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"test.sh ran past {timeout:g} s: {gone}")
            return VerifierResult.failed(f"verifier: test.sh ran past {timeout:g} s on the agent's work")
        if signalled(res.exit_code):
            return VerifierResult.failed(f"verifier: test.sh was killed by a signal (exit {res.exit_code}): "
                                         "a reward written before that is not counted")
        value = parse_reward(_read(box, REWARD_TXT), _read(box, REWARD_JSON))
        if isinstance(value, str):
            return VerifierResult.failed(f"verifier: {value} (test.sh exit {res.exit_code})")
        if value >= 1.0:
            return VerifierResult.success(reward=value)
        return VerifierResult.failed(f"verifier: reward {value:g} (test.sh exit {res.exit_code})", reward=value)


    # -- the positive control: Harbor's shared mode ------------------------------------------------
    def _stage_shared(self, task: HarborTask) -> None:
        """As Harbor 0.26 stages its shared mode: the reward files removed as root, the tests
        uploaded over ``/tests`` (files the agent put there stay), nothing of the agent ended."""
        self.verify_note = {"verifier": "harbor-shared", "trust": TRUST_SHARED, "trust_why": TRUST_SHARED_WHY}
        box = self.box
        removed = exec_as_root(box, ["rm", "-f", "--", REWARD_TXT, REWARD_JSON], timeout=30, cwd="/")
        if removed.exit_code != 0:  # Harbor stops with an error here
            raise PolicyFault(f"Harbor's shared mode: the reward files could not be removed (exit {removed.exit_code})")
        box.put_files("/tests", task.tests)
        exec_as_root(box, ["sh", "-c", "mkdir -p /logs/verifier && chmod 0777 /logs/verifier"], timeout=30, cwd="/")

    def _run_shared(self, task: HarborTask, timeout: float, script: str = "/tests/test.sh") -> VerifierResult:
        """As Harbor 0.26 runs it: test.sh (``script``) made executable and run (its own shebang) in
        the agent's container, its output to ``/logs/verifier/test-stdout.txt``, then the reward file
        read."""
        res = self.box.exec(["/bin/sh", "-c", 'chmod +x "$1" && "$1" > /logs/verifier/test-stdout.txt 2>&1', "test",
                             script], timeout=timeout, cwd=task.workdir, env=task.spec.env)
        self.verify_note["test_exit"] = res.exit_code
        value = parse_reward(_read(self.box, REWARD_TXT), _read(self.box, REWARD_JSON))
        if isinstance(value, str):
            return VerifierResult.failed(f"verifier (harbor-shared): {value} (test.sh exit {res.exit_code})")
        if value >= 1.0:
            return VerifierResult.success(reward=value)
        return VerifierResult.failed(f"verifier (harbor-shared): reward {value:g}", reward=value)


def _read(box: Sandbox, path: str) -> bytes | None:
    with contextlib.suppress(FileNotFoundError):
        return box.read_file(path, limit=4096)
    return None
