"""Verifier runner: copied into a sandbox's verify folder and run there; its verdict cannot be forged.

Run by the harness as ``python3 -I runner.py VERIFY_DIR`` in the work folder with two lines on stdin:
a per-verification secret (hex) and a JSON config ``{"tests": [file names], "limit_s": seconds,
"task_modules": [top-level names the task's own files provide]}``.
The secret never appears on a command line, in the environment or in a file.

Two processes:

- The **parent** (this file, ``main``) never imports the code under test. It reads the secret, makes
  itself non-dumpable (so processes of the same user cannot read its memory), lists the hidden
  tests it expects from the test files' syntax (``ast``, no import), then prints
  ``DRUMSBENCH_READY <mac>`` and starts the child. It reads the child's report from a pipe, enforces
  the time limit, and prints exactly one ``DRUMSBENCH_VERDICT <mac> <json>``. ``mac`` is
  HMAC-SHA256(secret, text): the code under test never holds the secret, so it cannot print a
  verdict the harness accepts — on any stream, at exit, or from a background process.
- The **child** (``python3 -I runner.py --child VERIFY_DIR FD``) imports the hidden tests (and so the
  code under test) and runs them. Before any of that code is imported it sends a hello carrying a
  fresh nonce that every later message repeats, binds everything it needs to local names and
  installs an audit hook (PEP 578) that refuses what would let the code under test reach the
  runner's own objects or the parent: frame and garbage-collector introspection, tracing, native
  code (ctypes), process creation, signals, and reading /proc. After every test it checks that the
  test framework's classes were not changed.

Verdict statuses (the harness maps them; see docs/attribution.md):

- ``passed``: every expected test ran and passed (a skipped test never counts as passed);
- ``failed``: anything the code under test did — a failing, erroring or skipped test, an import
  error in the work tree, an exit or signal of the child, a hang past the limit, a flood, a refused
  operation, a changed framework — with the reason;
- ``no_tests``: the hidden test files define no test (a broken task: infrastructure);
- ``missing_dependency``: a hidden test file's own import statement names a module that is not one
  of the task's and that the sandbox's Python does not find with the work tree off ``sys.path``.
  The harness confirms it in a fresh sandbox (the policy could have deleted the module in this
  one) before it calls the attempt infrastructure.
"""

import ast
import json
import os
import select
import signal
import sys
import time

from drumsbench.core.verdict_lines import ready_line, verdict_line  # its text, when shipped (verdict_channel)

# hashlib, hmac (the parent's MAC) and subprocess (the cold parent's child) are imported where they
# are used: the warm runner's child, forked from the parent, never needs them, so the parent
# imports them only after the fork.

# The typing module's own flag, without importing it (the runner imports as little as it can). No
# ``from __future__ import annotations``: compile() in the child inherits this file's future flags.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    import unittest
    from collections.abc import Iterable, Iterator, Sequence
    from typing import Any

    from _typeshed import OptExcInfo

MAX_LINE = 64 * 1024
MAX_REPORT = 4 * 1024 * 1024


# -- parent -----------------------------------------------------------------------------------------
def _no_dump() -> None:
    """Make this process non-dumpable: same-user processes cannot ptrace it or read /proc/PID/mem."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _parse_tests(verify_dir: str, names: "Iterable[str]") -> dict[str, ast.Module]:
    """{hidden file name: its syntax tree}, each file read and parsed once per process (before any
    code under test runs, in the child); the four readers below take this."""
    trees: dict[str, ast.Module] = {}
    for name in names:
        with open(os.path.join(verify_dir, "tests", name), "rb") as f:
            trees[name] = ast.parse(f.read(), filename=name)
    return trees


def _expected_tests(trees: dict[str, ast.Module]) -> list[str]:
    """``module.Class.test_method`` of every test method defined in the hidden files, by syntax."""
    expected: list[str] = []
    for name, tree in trees.items():
        module = name[:-3] if name.endswith(".py") else name
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                        expected.append(f"{module}.{node.name}.{item.name}")
    return expected


def _test_imports(trees: dict[str, ast.Module]) -> set[str]:
    """Top-level modules that the hidden test files import themselves (by syntax)."""
    found: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def _test_bindings(trees: dict[str, ast.Module], task_modules: frozenset[str]
                   ) -> dict[str, dict[str, tuple[str, str | None]]]:
    """Per hidden test module: {name it binds at top level: (module, attribute or None)} for its
    imports of modules that are not the task's, by syntax."""
    out: dict[str, dict[str, tuple[str, str | None]]] = {}
    for name, tree in trees.items():
        binds: dict[str, tuple[str, str | None]] = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] not in task_modules:
                        binds[a.asname or a.name.split(".")[0]] = ((a.asname and a.name) or a.name.split(".")[0], None)
            elif (isinstance(node, ast.ImportFrom) and node.module and not node.level
                  and node.module.split(".")[0] not in task_modules):
                for a in node.names:
                    if a.name != "*":
                        binds[a.asname or a.name] = (node.module, a.name)
        out[name[:-3]] = binds
    return out


def _test_classes(trees: dict[str, ast.Module]) -> dict[str, dict[str, tuple[set[str], bool]]]:
    """Per hidden test module: {class name: (names its body defines, whether it defines tests)}, by syntax."""
    out: dict[str, dict[str, tuple[set[str], bool]]] = {}
    for name, tree in trees.items():
        classes: dict[str, tuple[set[str], bool]] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined: set[str] = set()
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        defined.add(item.name)
                    elif isinstance(item, ast.Assign):
                        defined.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        defined.add(item.target.id)
                classes[node.name] = (defined, any(d.startswith("test") for d in defined))
        out[name[:-3]] = classes
    return out


def _binary_in_tree(root: str, limit: int = 20000) -> str | None:
    """The first file under ``root`` that is a native module (an extension suffix or ELF bytes)."""
    import importlib.machinery

    suffixes = (*importlib.machinery.EXTENSION_SUFFIXES, ".so")
    seen = 0
    for folder, _dirs, files in os.walk(root):
        for f in files:
            seen += 1
            if seen > limit:
                return None
            path = os.path.join(folder, f)
            if f.endswith(suffixes):
                return path
            try:
                with open(path, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        return path
            except OSError:
                pass
    return None


def _image_has(module: str) -> bool:
    """Does the image provide top-level ``module`` with the work tree and the tests off sys.path?"""
    import importlib.util

    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in saved if p and os.path.isabs(p) and not p.startswith(os.getcwd())]
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = saved


def _read_report(proc: "subprocess.Popen[bytes] | None", rfd: int, deadline: float
                 ) -> "tuple[list[dict[str, Any]], str | None]":
    """Events from the child until EOF, the deadline or a flood: (events, problem or None)."""
    events: list[dict[str, Any]]
    nonce: str | None
    events, buf, total, nonce = [], b"", 0, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return events, "timeout"
        ready, _, _ = select.select([rfd], [], [], left)
        if not ready:
            continue
        chunk = os.read(rfd, 65536)
        if not chunk:
            return events, None
        total += len(chunk)
        if total > MAX_REPORT:
            return events, "flood"
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # not from the runner's writer: ignored
            if not isinstance(ev, dict):
                continue
            if nonce is None:
                if ev.get("ev") != "hello" or not isinstance(ev.get("n"), str):
                    return events, "the child's first message was not its hello"
                nonce = ev["n"]
                continue
            if ev.get("n") != nonce:
                continue  # not carrying the nonce: not from the runner's writer
            events.append(ev)
        if len(buf) > MAX_LINE:
            return events, "flood"


def _verdict(expected: "Sequence[str]", events: "Iterable[dict[str, Any]]", problem: str | None,
             exit_code: int | None, test_imports: frozenset[str] = frozenset(),
             task_modules: frozenset[str] = frozenset()) -> dict[str, str | int]:
    by_id: dict[str, list[str]]
    import_errors: list[dict[str, Any]]
    reason: str | None
    by_id, import_errors, reason, done = {}, [], None, False
    for ev in events:
        kind = ev.get("ev")
        if kind == "test":
            by_id.setdefault(str(ev.get("id")), []).append(str(ev.get("status")))
        elif kind == "import_error":
            import_errors.append(ev)
        elif kind == "refused" and reason is None:
            reason = f"the code under test tried a refused operation: {ev.get('what')}"
        elif kind == "tampered" and reason is None:
            reason = f"the code under test changed the test framework: {ev.get('what')}"
        elif kind == "done":
            done = True
    counts = {"expected": len(expected), "reported": sum(len(v) for v in by_id.values())}
    for status in ("pass", "fail", "error", "skip", "xfail", "xpass"):
        counts[status] = sum(v.count(status) for v in by_id.values())
    if not expected:
        return {"status": "no_tests", "reason": "the hidden test files define no test", **counts}
    for ev in import_errors:
        top = str(ev.get("missing") or "").split(".")[0]
        if top and top in test_imports and top not in task_modules and not _image_has(top):
            return {"status": "missing_dependency", "module": top,
                    "reason": f"hidden test {ev.get('file')} imports {top}, which the image lacks", **counts}
    if problem == "timeout":
        reason = "the code under test ran past the verifier's time limit"
    elif problem == "flood":
        reason = "the code under test flooded the report channel"
    elif problem:
        reason = problem
    if reason is None and import_errors:
        ev = import_errors[0]
        reason = f"hidden test {ev.get('file')} could not import: {ev.get('error')}"
    if reason is None and not done:
        reason = f"the verification ended before its last test (child exit {exit_code})"
    if reason is None:
        missing_ids = [t for t in expected if "pass" not in by_id.get(t, [])]
        bad = [t for t, v in by_id.items() if any(s != "pass" for s in v)]
        if missing_ids or bad:
            first = (bad or missing_ids)[0]
            reason = (f"{len(expected) - len(missing_ids)} of {len(expected)} expected tests passed; "
                      f"{first}: {','.join(by_id.get(first, ['not run']))}")
    if reason is None:
        return {"status": "passed", "reason": "", **counts}
    return {"status": "failed", "reason": reason[:300], **counts}


def main() -> None:
    import subprocess

    secret = bytes.fromhex(sys.stdin.readline().strip())
    config = json.loads(sys.stdin.readline())
    if len(secret) < 16:
        raise SystemExit("runner: no secret on stdin")
    _no_dump()
    verify_dir = os.path.abspath(sys.argv[1])
    expected = _expected_tests(_parse_tests(verify_dir, config["tests"]))
    print(ready_line(secret), flush=True)
    deadline = time.monotonic() + float(config["limit_s"])
    rfd, wfd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), "--child", verify_dir, str(wfd),
         ",".join(config.get("task_modules", ())), *config["tests"]],
        pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    os.close(wfd)
    events, problem = _read_report(proc, rfd, deadline)
    try:
        exit_code: int | None = proc.wait(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        exit_code = None
        problem = problem or "timeout"
    try:  # noqa: SIM105 - the runner imports as little as it can
        os.killpg(proc.pid, signal.SIGKILL)  # the child's session: whatever it left running
    except OSError:
        pass
    if exit_code is None:
        proc.wait()
    _print_verdict(secret, config, verify_dir, expected, events, problem, exit_code)


def _print_verdict(secret: bytes, config: "dict[str, Any]", verify_dir: str, expected: "Sequence[str]",
                   events: "Iterable[dict[str, Any]]", problem: str | None, exit_code: int | None) -> None:
    # The harness's list of the tests' imports (read from the task's own bytes), never the staged
    # files again: the code under test could have rewritten them by now.
    verdict = json.dumps(_verdict(expected, events, problem, exit_code, frozenset(config.get("test_imports", ())),
                                  frozenset(config.get("task_modules", ()))), sort_keys=True)
    sys.stdout.write(verdict_line(secret, verdict) + "\n")
    sys.stdout.flush()


# -- warm: one interpreter, the child forked from it -------------------------------------------------
def warm_main(verify_dir: str, drop_uid: int | None = None) -> None:
    """``python3 -I runner.py --warm VERIFY_DIR``: the same stdin, output and verdicts as ``main``,
    with one interpreter instead of two. ``drop_uid`` (the kept server's workers, which run as the
    harness's uid): the child drops to it (``_drop_to``) before it reads its config.

    Everything the child needs is imported first (unittest, secrets, types: nothing of the work
    tree, which is not on ``sys.path``). Then the child is forked **before the secret is read**: it
    never holds the secret, not even in memory it inherited. The child points stdin, stdout and
    stderr at /dev/null (the unread secret stays in the parent's pipe), leaves the parent's session
    (``killpg`` then ends whatever it starts), waits for its config on a pipe and runs ``child``
    exactly as the cold child does; it ends with an ``_exit`` bound before the code under test ran,
    so it never returns into the parent's code. The parent then goes on as ``main``: it makes
    itself non-dumpable (``ctypes`` is imported only now, never into the child), reads the secret,
    prints READY, hands the child its config, reads the report and prints the verdict."""
    import secrets  # noqa: F401 - the child's imports, done before the fork
    import types  # noqa: F401
    import unittest  # noqa: F401

    rfd, wfd = os.pipe()  # report: child -> parent
    cfg_r, cfg_w = os.pipe()  # config: parent -> child
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _exit, code = os._exit, 1
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            for fd in (null, rfd, cfg_w):
                os.close(fd)
            os.setsid()
            if drop_uid is not None:
                _drop_to(drop_uid, keep=(cfg_r, wfd))
            data = b""
            while True:
                chunk = os.read(cfg_r, 65536)
                if not chunk:
                    break
                data += chunk
            os.close(cfg_r)
            if data:  # nothing: the parent gave up before the tests
                cfg = json.loads(data)
                child(verify_dir, wfd, frozenset(cfg["task_modules"]), list(cfg["tests"]))
                code = 0
        finally:
            _exit(code)
    os.close(wfd)
    os.close(cfg_r)
    if drop_uid is None:  # a worker of the kept server runs as another uid than its child: no need
        _no_dump()
    secret = bytes.fromhex(sys.stdin.readline().strip())
    config = json.loads(sys.stdin.readline())
    if len(secret) < 16:
        raise SystemExit("runner: no secret on stdin")
    expected = _expected_tests(_parse_tests(verify_dir, config["tests"]))
    print(ready_line(secret), flush=True)
    deadline = time.monotonic() + float(config["limit_s"])
    os.write(cfg_w, json.dumps({"tests": list(config["tests"]),
                                "task_modules": list(config.get("task_modules", ()))}).encode())
    os.close(cfg_w)
    events, problem = _read_report(None, rfd, deadline)
    exit_code = _wait_child(pid, max(0.1, min(2.0, deadline - time.monotonic())))
    if exit_code is None:
        problem = problem or "timeout"
    for kill in (os.killpg, os.kill):  # the child's session (whatever it left running), then the child
        try:  # noqa: SIM105 - the runner imports as little as it can
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if exit_code is None:
        os.waitpid(pid, 0)
    _print_verdict(secret, config, verify_dir, expected, events, problem, exit_code)


def _drop_to(uid: int, keep: "Iterable[int]") -> None:
    """Become ``uid`` (its own gid, no supplementary groups) for good, with no descriptor but
    0-2 and ``keep`` and the OOM score of an ordinary process (the kept server's is -1000)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("0")
    except OSError:
        pass
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise SystemExit("runner: could not drop to the sandbox's uid")


# -- kept: one server per sandbox, started before the policy's first action -------------------------
def _read_line(fd: int, limit: int = 64) -> bytes:
    """One line from ``fd``, a byte at a time (nothing after it is taken from the pipe); b"" at EOF."""
    line = b""
    while len(line) < limit:
        ch = os.read(fd, 1)
        if not ch or ch == b"\n":
            break
        line += ch
    return line


def serve_main(verify_dir: str, work_dir: str, uid: int) -> None:
    """``python3 -I -c RUNNER --serve VERIFY_DIR WORK_DIR UID``: the kept verifier.

    Started by the harness as its own uid through the sandbox's ``Helpers`` capability, at reset,
    before the policy's first action, and kept across resets: the sandbox's uid cannot signal,
    trace or read it, and ``end_processes`` spares it. Its source comes on the command line, not
    from a file of the sandbox. It imports what the child needs, then serves: it reads one line
    from stdin a byte at a time (``go``: one verification; anything else or EOF: the end), forks a
    **worker** and waits for it, then prints ``DRUMSBENCH_HELPER_END <the worker's exit status>``.
    The server never reads a secret. The worker runs ``warm_main`` in the work folder with the
    lines the harness sent after ``go`` (the secret, the config): it forks the child before it
    reads the secret, and the child drops to UID before it reads its config and imports the code
    under test (``_drop_to``). Nothing of a verification stays in the server: each is a fork."""
    import hashlib  # noqa: F401 - the worker's (``mac``), once for every verification
    import hmac  # noqa: F401
    import secrets  # noqa: F401 - the child's imports, once for every verification
    import types  # noqa: F401
    import unittest  # noqa: F401

    while _read_line(0) == b"go":
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.chdir(work_dir)
                warm_main(verify_dir, uid)
                code = 0
            except BaseException as e:
                try:
                    sys.stderr.write(f"runner worker: {type(e).__name__}: {e}\n")
                    sys.stderr.flush()
                except BaseException:
                    pass
            finally:
                try:  # noqa: SIM105
                    sys.stdout.flush()
                except BaseException:
                    pass
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        os.write(1, f"\nDRUMSBENCH_HELPER_END {code}\n".encode())


def _wait_child(pid: int, timeout: float) -> int | None:
    """The forked child's exit code (-N: killed by signal N), or None when it still runs after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() >= end:
            return None
        time.sleep(0.002)


# -- child ------------------------------------------------------------------------------------------
def child(verify_dir: str, fd: int, task_modules: frozenset[str], names: "Sequence[str]") -> None:
    """Run the hidden tests; report on fd ``fd``. Everything it uses later is bound to locals
    (and closures) before the first import of the code under test, so patching module globals or
    ``os`` does not reach it."""
    import secrets
    import unittest

    write, dumps, monotonic = os.write, json.dumps, time.monotonic
    nonce = secrets.token_hex(16)
    tests_dir = os.path.join(verify_dir, "tests")
    write(fd, (dumps({"ev": "hello", "n": nonce}) + "\n").encode())

    def emit(**ev: object) -> None:
        ev["n"] = nonce
        try:  # noqa: SIM105 - only names bound before the code under test was imported
            write(fd, (dumps(ev, default=str)[:MAX_LINE - 2] + "\n").encode())
        except OSError:
            pass

    frame_attrs = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
    no_import = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})
    refused_events = frozenset({
        "sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects",
        "gc.get_referrers", "gc.get_referents", "os.kill", "os.killpg", "signal.pthread_kill",
        "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
        "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "pty.spawn",
        "os.startfile", "code.__new__", "function.__new__", "sys.remote_exec",
    })
    report_refusal = [True]

    def refuse(what: str) -> PermissionError:
        if report_refusal[0]:
            report_refusal[0] = False
            emit(ev="refused", what=what)
            report_refusal[0] = True
        return PermissionError(f"refused while the verifier runs: {what}")

    compiled: set[str] = set()

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "compile" and len(args) > 1 and isinstance(args[1], str) and args[1].startswith(tests_dir):
            if args[1] in compiled:
                raise refuse(f"compiling {args[1]} again")
            compiled.add(args[1])
            return
        if event == "sys._getframe":
            raise ValueError("frame introspection is refused while the verifier runs")
        if event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attrs:
            raise AttributeError(f"{args[1]} is refused while the verifier runs")
        if event in refused_events:
            raise refuse(event)
        if event == "import" and args and str(args[0]).split(".")[0] in no_import:
            raise refuse(f"import {args[0]}")
        if event in ("open", "os.listdir", "os.scandir") and args:
            path = args[0]
            if isinstance(path, bytes):
                path = path.decode(errors="replace")
            if isinstance(path, str) and os.path.abspath(path).startswith("/proc/"):
                raise refuse(f"{event} {path}")

    # assertRaises clears its traceback's frames (only to free memory) through tb_frame, which the
    # hook refuses: give unittest a traceback module whose clear_frames leaves them.
    import types

    vars(unittest.case)["traceback"] = types.SimpleNamespace(clear_frames=lambda tb: None)  # the module's own name
    statuses: dict[str, str] = {}

    class Result(unittest.TestResult):
        def _put(self, test: unittest.TestCase, status: str) -> None:
            tid = test.id()
            if statuses.get(tid, "pass") == "pass":
                statuses[tid] = status

        def addSuccess(self, test: unittest.TestCase) -> None:
            self._put(test, "pass")

        def addFailure(self, test: unittest.TestCase, err: "OptExcInfo") -> None:
            self._put(test, "fail")

        def addError(self, test: unittest.TestCase, err: "OptExcInfo") -> None:
            self._put(test, "error")

        def addSkip(self, test: unittest.TestCase, reason: str) -> None:
            self._put(test, "skip")

        def addExpectedFailure(self, test: unittest.TestCase, err: "OptExcInfo") -> None:
            self._put(test, "xfail")

        def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
            self._put(test, "xpass")

        def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: "OptExcInfo | None") -> None:
            if err is not None:
                self._put(test, "fail")

    trees = _parse_tests(verify_dir, names)  # read once, before any code under test runs
    # What the hidden tests import from outside the task is imported now, before the work tree is
    # on sys.path: a module of the policy's named like it (datetime.py) cannot stand in for it.
    for top in sorted(_test_imports(trees) - task_modules):
        try:  # noqa: SIM105
            __import__(top)
        except BaseException:  # missing from the image: reported when the test imports it
            pass

    # Issue 29's three classes, detected (never prevented: this process runs the policy's code).
    # A native module in the work tree (it could walk frames in C, where no audit event fires).
    binary = _binary_in_tree(os.getcwd())
    if binary is not None:
        emit(ev="refused", what=f"a native module in the work tree: {os.path.relpath(binary)}")
        return
    # What each hidden test module's own imports bind, as they are before any code under test runs:
    # after its import and after every test the module's names must still be these objects.
    bindings: dict[str, dict[str, object]] = {}
    for module_name, binds in _test_bindings(trees, task_modules).items():
        expect: dict[str, object] = {}
        for bound, (src, attr) in binds.items():
            mod = sys.modules.get(src)
            if mod is None:
                continue  # not importable from the image: reported when the test imports it
            if attr is None:
                expect[bound] = mod
            elif hasattr(mod, attr):
                expect[bound] = getattr(mod, attr)
        bindings[module_name] = expect
    class_bodies = _test_classes(trees)
    allowed_dunders = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                                 "__annotations__", "__firstlineno__", "__static_attributes__",
                                 "_classSetupFailed", "_class_cleanups"})

    # assertEqual compares values of one type (numbers of different types aside): an object of
    # the policy's whose __eq__ says yes to everything does not equal an expected int or str.
    base_assert_equal = unittest.TestCase.assertEqual
    numbers = (bool, int, float, complex)

    def assert_equal(self: unittest.TestCase, first: object, second: object, msg: object = None) -> None:
        if type(first) is not type(second) and not (isinstance(first, numbers) and isinstance(second, numbers)):
            raise self.failureException(msg or f"{type(first).__name__} is not {type(second).__name__}")
        base_assert_equal(self, first, second, msg)

    unittest.TestCase.assertEqual = assert_equal  # type: ignore[method-assign]
    unittest.TestCase.assertEquals = assert_equal

    sys.path[:0] = [os.getcwd(), tests_dir]
    # The framework's parts as they were before the code under test could run.
    watched: list[type] = [unittest.TestCase, unittest.TestSuite, unittest.TestResult, unittest.TestLoader,
                           vars(unittest.case)["_Outcome"],  # private to unittest: not in its stubs
                           unittest.FunctionTestCase, unittest.SkipTest]
    snapshot = {(c, k): v for c in watched for k, v in vars(c).items()}
    import builtins

    module_snapshot = {(m, k): v for m in (unittest, unittest.case, unittest.suite, builtins)
                       for k, v in vars(m).items() if not k.startswith("__") or m is builtins}
    sizes = {c: len(vars(c)) for c in watched}
    items, vars_, len_ = snapshot.items, vars, len

    def test_module_changed(module: types.ModuleType) -> str | None:
        """The hidden test module's imported names rebound, or a test class given parts its body
        does not define or a base that is neither the file's own class nor the framework's."""
        namespace = vars_(module)
        for bound, obj in bindings.get(module.__name__, {}).items():
            if namespace.get(bound) is not obj:
                return f"{module.__name__}.{bound} is not what the hidden test imported"
        framework = set(watched) | {object}
        own_classes = class_bodies.get(module.__name__, {})
        for cls_name, (body, has_tests) in own_classes.items():
            if not has_tests:
                continue
            cls = namespace.get(cls_name)
            if not isinstance(cls, type):
                return f"{module.__name__}.{cls_name} is not the hidden test's class"
            if type(cls) is not type:
                return f"{module.__name__}.{cls_name} has another metaclass"
            extra = set(vars_(cls)) - body - allowed_dunders
            if extra:
                return f"{module.__name__}.{cls_name} was given {', '.join(sorted(extra))}"
            for base in cls.__mro__:
                own = base.__module__ == module.__name__ and base.__qualname__ in own_classes
                if not own and base not in framework:
                    return f"{module.__name__}.{cls_name} derives from {base.__qualname__}, not the framework's"
        return None

    def tampered() -> str | None:
        for cls, size in sizes.items():
            if len_(vars_(cls)) != size:
                return f"{cls.__name__} (attributes added or removed)"
        for (cls, key), value in items():
            if vars_(cls).get(key, value) is not value or key not in vars_(cls):
                return f"{cls.__name__}.{key}"
        for (mod, key), value in module_snapshot.items():
            if vars_(mod).get(key) is not value:
                return f"{mod.__name__}.{key}"
        return None

    # The hidden tests' sources, read now (before any code under test runs) and imported from this
    # memory only: a test file rewritten on disk by the code under test that an earlier test file
    # imported (or a planted __pycache__) is never what runs.
    import importlib.machinery

    held: dict[str, tuple[str, bytes]] = {}
    for name in names:
        path = os.path.join(tests_dir, name)
        with open(path, "rb") as f:
            held[name[:-3]] = (path, f.read())

    class HeldTests:
        @staticmethod
        def find_spec(fullname: str, path: "Sequence[str] | None" = None, target: types.ModuleType | None = None
                      ) -> importlib.machinery.ModuleSpec | None:
            if fullname not in held:
                return None
            # the class is the loader (static methods), not an importlib.abc.Loader subclass
            spec = importlib.machinery.ModuleSpec(fullname, HeldTests,  # type: ignore[arg-type]
                                                  origin=held[fullname][0])
            spec.has_location = True
            return spec

        @staticmethod
        def create_module(spec: importlib.machinery.ModuleSpec) -> None:
            return None

        @staticmethod
        def exec_module(module: types.ModuleType) -> None:
            path, source = held[module.__name__]
            exec(compile(source, path, "exec"), module.__dict__)

    sys.meta_path.insert(0, HeldTests)
    loader, result = unittest.TestLoader(), Result()
    sys.addaudithook(hook)
    for name in names:
        module = name[:-3]
        try:
            suite = loader.loadTestsFromModule(__import__(module))
        except BaseException as e:  # an import of the code under test may raise anything
            emit(ev="import_error", file=name, error=f"{type(e).__name__}: {e}"[:300],
                 missing=e.name if isinstance(e, ModuleNotFoundError) else None)
            continue
        loaded = sys.modules.get(module)
        bad = tampered() or (test_module_changed(loaded) if loaded is not None else f"{module} vanished")
        if bad or loaded is None:  # loaded None: bad says so
            emit(ev="tampered", what=bad or f"{module} vanished")
            return
        for test in _flatten(suite):
            method = getattr(type(test), test._testMethodName, None)
            code = getattr(method, "__code__", None)
            if code is None or code.co_filename != os.path.join(tests_dir, name):
                emit(ev="tampered", what=f"{test.id()} is not the hidden test's own code")
                return
            t0 = monotonic()
            test.run(result)
            bad = tampered() or test_module_changed(loaded)
            if bad:
                emit(ev="tampered", what=bad)
                return
            tid = test.id()
            emit(ev="test", id=tid, status=statuses.get(tid, "error"), s=round(monotonic() - t0, 4))
    emit(ev="done")


def _flatten(suite: "Iterable[unittest.TestCase | unittest.TestSuite]") -> "Iterator[unittest.TestCase]":
    for item in suite:
        if hasattr(item, "__iter__"):
            yield from _flatten(item)
        else:
            yield item


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), frozenset(sys.argv[4].split(",")) - {""}, sys.argv[5:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--warm":
        warm_main(os.path.abspath(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_main(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
