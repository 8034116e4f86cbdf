"""The trusted judge: runs a coding task's hidden tests where the policy's code never runs.

Run by the harness on the host, as the harness's uid: ``python -I -m drumsbench.envs.coding.judge
RFD WFD``, where RFD/WFD are the read and write ends of the line channel to the boundary server
(``boundary_server.py``) that runs the code under test in the sandbox, as the sandbox's uid. Two
lines on stdin: the per-verification secret (hex) and a JSON config ``{"tests": {file name:
source}, "task_modules": [top-level names], "limit_s": seconds}``. Output: ``DRUMSBENCH_READY``
then one ``DRUMSBENCH_VERDICT`` (``core/verdict_channel``).

The hidden tests, ``unittest``, the result objects and the verdict are this process's own; nothing
of the work tree is imported, loaded or executed here. Importing a task module (``task_modules``)
gives a ``RemoteModule``; every attribute, call, ``str``/``repr``/``len``/``bool``/iteration/item/
membership/format on it and on what it returns is forwarded to the server. Only **plain data**
comes back as itself (``boundary_server.encode``); other objects are ``Remote`` handles, whose
comparison (``==``, ``<``, ...) raises ``BoundaryError``: an object of the code under test is never
compared by its own ``__eq__`` here. A dataclass instance comes back as a ``RemoteRecord``, which
compares **here** by its class's name and its fields' plain values (a dataclass's generated
``__eq__``). Exceptions the code under test raises come back as type name + message and are raised
here as the builtin class of that name or a class made here per name (so ``assertRaises`` works).

Verdict statuses: ``passed`` (every test the files define — by syntax — ran and passed; a skip is
not a pass), ``failed`` (with the reason), ``no_tests``, ``missing_dependency`` (a hidden test's own
import of a module that is not the task's and that this judge's Python lacks: infrastructure, the
policy cannot touch it), ``server_lost`` (the server ended, broke the format or ran past the limit:
the harness decides from the sandbox's state whether that is the policy's doing).
"""

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import select
import sys
import time
import types
import unittest

# No ``from __future__ import annotations``: run_tests compiles the hidden tests with compile(),
# which inherits this file's future flags (their annotations would turn into strings).
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from drumsbench.core.verdict_lines import ready_line, verdict_line
from drumsbench.envs.coding import test_style
from drumsbench.envs.coding.boundary_server import BoundaryError, decode, encode

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from drumsbench.envs.coding.judge_pytest import Recorder

_T = TypeVar("_T")

MAX_ANSWER = 16 * 1024 * 1024


class ServerLost(BaseException):
    """The boundary server ended, broke the format or ran past the limit (``Link.lost`` says which)."""


class Link:
    """The judge's end of the line channel to the boundary server."""

    def __init__(self, rfd: int, wfd: int, deadline: float) -> None:
        self.rfd, self.wfd, self.deadline = rfd, wfd, deadline
        self.buf = b""
        self.lost: str | None = None
        self.calls = 0
        self.exc_classes: dict[str, type[Exception]] = {}
        self.where: str | None = None  # what the judge was doing (an import of a hidden file, a test id)
        self.lost_during: str | None = None

    def request(self, op: str, **args: Any) -> Any:
        """Send one request, return the decoded answer, or raise the code under test's exception."""
        if self.lost is not None:
            raise ServerLost(self.lost)
        if time.monotonic() > self.deadline:
            self._lose("the code under test ran past the verifier's time limit")
        self.calls += 1
        line = json.dumps({"op": op, **args}, separators=(",", ":")).encode() + b"\n"
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self.wfd, view):]
        except OSError as e:
            self._lose(f"the code under test's server closed its input ({e.strerror})")
        answer = self._read_line()
        try:
            msg = json.loads(answer)
            if type(msg) is not dict or len(msg) != 1:
                raise BoundaryError("an answer is one object with ok or err")
            if "ok" in msg:
                return self.decode(msg["ok"])
            err = msg["err"]
            if type(err) is not dict:
                raise BoundaryError("malformed err")
            mro = [str(n) for n in err.get("mro", ())] or ["builtins.Exception"]
            exc: Any = make_exception(self.exc_class(mro), str(err.get("msg", ""))[:2000])
        except (ValueError, KeyError, TypeError, RecursionError, BoundaryError) as e:
            self._lose(f"the code under test's server broke the answer format: {str(e)[:160]}")
        exc.drumsbench_remote = True
        raise exc

    def _lose(self, why: str) -> NoReturn:
        self.lost = why
        self.lost_during = self.where
        raise ServerLost(why)

    def _read_line(self) -> bytes:
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._lose("the code under test ran past the verifier's time limit")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                self._lose("the code under test's server ended")
            self.buf += chunk
            if len(self.buf) > MAX_ANSWER:
                self._lose("the code under test's server flooded the channel")
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def decode(self, data: Any) -> Any:
        return decode(data, lambda n, t: Remote(self, n, t), lambda n, c, f: RemoteRecord(self, n, c, f),
                      self.exc_class)

    def encode(self, value: object) -> Any:
        return encode(value, _judge_handle)

    def exc_class(self, mro: list[str]) -> type[Exception]:
        """The judge's class for an exception class of the code under test, one per name."""
        name = mro[0]
        cls = self.exc_classes.get(name)
        if cls is not None:
            return cls
        builtin = _builtin_exception(name)
        if builtin is not None:
            self.exc_classes[name] = builtin
            return builtin
        base: type[Exception] = RemoteError
        for n in mro[1:]:
            found = _builtin_exception(n)
            if found is not None:
                base = found
                break
        module, _, qual = name.rpartition(".")
        cls = type(qual or "RemoteError", (base,), {"__module__": module or "remote", "__qualname__": qual})
        self.exc_classes[name] = cls
        return cls


def _builtin_exception(name: str) -> type[Exception] | None:
    """The judge's own exception class of that qualified name: a builtin, or a class of a standard
    library module the judge has already imported (``decimal.InvalidOperation``); nothing is
    imported by a name the server sent."""
    module, _, qual = name.rpartition(".")
    if module == "builtins":
        import builtins

        found = getattr(builtins, qual, None)
    elif module.split(".")[0] in sys.stdlib_module_names and module in sys.modules and "." not in qual:
        found = getattr(sys.modules[module], qual, None)
    else:
        return None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def make_exception(cls: type[Exception], msg: str) -> Exception:
    """An instance of ``cls`` carrying ``msg``, also for classes whose constructor wants more."""
    try:
        return cls(msg)
    except Exception:
        exc = cls.__new__(cls, msg)
        exc.args = (msg,)
        return exc


class RemoteError(Exception):
    """Base of the judge's classes for exceptions of the code under test that are not Exceptions
    (SystemExit, KeyboardInterrupt, BaseException itself): a test sees them as errors."""


def _judge_handle(obj: object) -> Any:
    if isinstance(obj, Remote):
        return object.__getattribute__(obj, "_db_n")
    raise BoundaryError(f"cannot hand a {type(obj).__name__} of the tests to the code under test")


class Remote:
    """An object of the code under test, by handle; every use is forwarded, never compared here."""

    __slots__ = ("_db_link", "_db_n", "_db_type")

    def __init__(self, link: Link, n: int, type_name: str) -> None:
        object.__setattr__(self, "_db_link", link)
        object.__setattr__(self, "_db_n", n)
        object.__setattr__(self, "_db_type", type_name)

    def _db_ask(self, op: str, **args: Any) -> Any:
        link = object.__getattribute__(self, "_db_link")
        return link.request(op, h=object.__getattribute__(self, "_db_n"), **args)

    def _db_typed(self, op: str, kind: type[_T], **args: Any) -> _T:
        value = self._db_ask(op, **args)
        if type(value) is not kind:
            raise BoundaryError(f"{op}() of a {object.__getattribute__(self, '_db_type')} gave a "
                                f"{type(value).__name__}, not plain {kind.__name__}")
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._db_ask("getattr", name=name)

    def __setattr__(self, name: str, value: object) -> None:
        link = object.__getattribute__(self, "_db_link")
        self._db_ask("setattr", name=name, v=link.encode(value))

    def __call__(self, *args: object, **kwargs: object) -> Any:
        link = object.__getattribute__(self, "_db_link")
        return self._db_ask("call", a=link.encode(list(args)), kw=link.encode(dict(kwargs)))

    def __str__(self) -> str:
        return self._db_typed("str", str)

    def __repr__(self) -> str:
        return self._db_typed("repr", str)

    def __format__(self, spec: str) -> str:
        return self._db_typed("format", str, spec=spec)

    def __len__(self) -> int:
        return self._db_typed("len", int)

    def __bool__(self) -> bool:
        return self._db_typed("bool", bool)

    def __iter__(self) -> "Iterator[Any]":
        return iter(self._db_typed("list", list))

    def __getitem__(self, key: object) -> Any:
        link = object.__getattribute__(self, "_db_link")
        return self._db_ask("getitem", k=link.encode(key))

    def __contains__(self, value: object) -> bool:
        link = object.__getattribute__(self, "_db_link")
        return self._db_typed("contains", bool, v=link.encode(value))

    def __instancecheck__(self, value: object) -> bool:
        link = object.__getattribute__(self, "_db_link")
        return self._db_typed("isinstance", bool, v=link.encode(value))

    def __hash__(self) -> int:
        return hash((id(object.__getattribute__(self, "_db_link")), object.__getattribute__(self, "_db_n")))

    def _db_refuse(self, other: object) -> bool:
        raise BoundaryError(f"a {object.__getattribute__(self, '_db_type')} of the code under test is compared: "
                            "the judge compares plain data only (compare its fields or str())")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _db_refuse


class RemoteRecord(Remote):
    """A dataclass instance of the code under test: uses are forwarded like ``Remote``'s, but it
    compares here, by its class's qualified name and its compared fields' plain values."""

    __slots__ = ("_db_cls", "_db_fields")

    def __init__(self, link: Link, n: int, cls: str, fields: list[tuple[str, Any]]) -> None:
        super().__init__(link, n, cls)
        object.__setattr__(self, "_db_cls", cls)
        object.__setattr__(self, "_db_fields", tuple(fields))

    def _db_key(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return (object.__getattribute__(self, "_db_cls"), object.__getattribute__(self, "_db_fields"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteRecord) and self._db_key() == other._db_key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._db_key())

    def __repr__(self) -> str:
        cls, fields = self._db_key()
        return f"{cls.rpartition('.')[2]}({', '.join(f'{k}={v!r}' for k, v in fields)})"


class RemoteModule(types.ModuleType):
    """A task module in the judge: its attributes are the server's module's, forwarded."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self.__dict__["_drumsbench_remote"].__getattr__(name)


class TaskModules(importlib.abc.Loader):
    """Imports of the task's own top-level names (and below) become ``RemoteModule``s."""

    def __init__(self, link: Link, names: list[str]) -> None:
        self.link, self.names = link, frozenset(names)

    def find_spec(self, fullname: str, path: "Sequence[str] | None",
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> RemoteModule:
        module = RemoteModule(spec.name)
        module.__dict__["_drumsbench_remote"] = self.link.request("import", name=spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# -- running the tests ---------------------------------------------------------------------------------
def expected_tests(sources: dict[str, str]) -> tuple[str, list[str]]:
    """(style, ids) of every test the files define, by syntax (``test_style``)."""
    return test_style.expected_tests({name: ast.parse(source, filename=name) for name, source in sources.items()})


class Record(unittest.TestResult):
    """Statuses per test id, written only here."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link
        self.statuses: dict[str, list[str]] = {}
        self.problems: dict[str, str] = {}  # test id -> its first failure or error, as text

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self.link.where = test.id()

    def _put(self, test: unittest.TestCase, status: str) -> None:
        self.statuses.setdefault(test.id(), []).append(status)

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._put(test, "pass")

    def addFailure(self, test: unittest.TestCase, err: tuple[Any, Any, Any]) -> None:
        self._put(test, "fail")
        self.first_problem(test, err)

    def addError(self, test: unittest.TestCase, err: tuple[Any, Any, Any]) -> None:
        self._put(test, "error")
        self.first_problem(test, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._put(test, "skip")

    def addExpectedFailure(self, test: unittest.TestCase, err: tuple[Any, Any, Any]) -> None:
        self._put(test, "xfail")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._put(test, "xpass")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: tuple[Any, Any, Any] | None) -> None:
        if err is not None:
            self._put(test, "fail" if issubclass(err[0], test.failureException) else "error")
            self.first_problem(subtest, err)

    def first_problem(self, test: unittest.TestCase,
                      err: tuple[type[BaseException], BaseException, types.TracebackType]) -> None:
        tid = getattr(test, "test_case", test).id()  # a subtest's: its test's
        self.problems.setdefault(tid, f"{err[0].__name__}: {str(err[1])[:200]}")


def run_tests(link: Link, sources: dict[str, str], task_modules: list[str]) -> dict[str, Any]:
    """The verdict (a dict) of running ``sources`` against the server behind ``link``."""
    style, expected = expected_tests(sources)
    if not expected:
        return {"status": "no_tests", "reason": "the hidden test files define no test", "expected": 0}
    sys.meta_path.insert(0, TaskModules(link, task_modules))
    if style == "pytest":
        return _run_pytest(link, sources, task_modules, expected)
    suite = unittest.TestSuite()
    for name, source in sorted(sources.items()):
        stem = name[:-3] if name.endswith(".py") else name
        module = types.ModuleType(stem)
        module.__file__ = f"<hidden>/{name}"
        sys.modules[stem] = module
        link.where = f"the import of hidden test {name}"
        try:
            exec(compile(source, name, "exec"), module.__dict__)
        except ServerLost:
            break
        except ImportError as e:
            top = (e.name or "").split(".")[0]
            if not getattr(e, "drumsbench_remote", False) and top and top not in task_modules:
                return {"status": "missing_dependency", "module": top, "expected": len(expected),
                        "reason": f"hidden test {name} imports {top}, which the judge's Python lacks"}
            return _failed(link, expected, f"hidden test {name} could not import: {type(e).__name__}: {e}")
        except Exception as e:
            return _failed(link, expected, f"hidden test {name} could not import: {type(e).__name__}: {e}")
        suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
    record = Record(link)
    if link.lost is None:
        suite.run(record)
    return verdict_of(expected, record, link)


def _run_pytest(link: Link, sources: dict[str, str], task_modules: list[str], expected: list[str]) -> dict[str, Any]:
    """``run_tests`` for pytest-style files (``judge_pytest``): a module the hidden tests import that
    is neither the task's nor this Python's is ``missing_dependency`` before pytest starts."""
    tasks = frozenset(task_modules)
    for name, source in sorted(sources.items()):
        for top in sorted(test_style.top_imports(ast.parse(source, filename=name)) - tasks):
            if importlib.util.find_spec(top) is None:
                return {"status": "missing_dependency", "module": top, "expected": len(expected),
                        "reason": f"hidden test {name} imports {top}, which the judge's Python lacks"}
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        return {"status": "missing_dependency", "module": "pytest", "expected": len(expected),
                "reason": f"the hidden tests are pytest's, which the judge's Python lacks "
                          f"(pip install 'drumsbench[pytest]'; {e})"}
    from drumsbench.envs.coding.judge_pytest import run_pytest

    record = run_pytest(link, sources)
    if link.lost is None and record.collect_errors:
        where, problem = record.collect_errors[0]
        return _failed(link, expected, f"hidden test {where} could not be collected: {problem}")
    return verdict_of(expected, record, link)


def _failed(link: Link, expected: list[str], reason: str) -> dict[str, Any]:
    if link.lost is not None:
        return {"status": "server_lost", "reason": link.lost, "during": link.lost_during, "expected": len(expected)}
    return {"status": "failed", "reason": reason[:300], "expected": len(expected)}


def verdict_of(expected: list[str], record: "Record | Recorder", link: Link) -> dict[str, Any]:
    by_id = record.statuses
    counts = {"expected": len(expected), "reported": sum(len(v) for v in by_id.values()), "calls": link.calls}
    for status in ("pass", "fail", "error", "skip", "xfail", "xpass"):
        counts[status] = sum(v.count(status) for v in by_id.values())
    if link.lost is not None:
        return {"status": "server_lost", "reason": link.lost, "during": link.lost_during, **counts}
    missing = [t for t in expected if not by_id.get(t)]
    bad = [t for t, v in by_id.items() if any(s != "pass" for s in v)]
    if missing or bad:
        # "...; <first test that did not pass>: <its statuses>" as the in-process runner says it (tasks
        # check names flaky tests from it), then the first problem's exception
        first = (bad or missing)[0]
        passed = len([t for t in expected if by_id.get(t) and all(s == "pass" for s in by_id[t])])
        problem = record.problems.get(first)
        statuses = ",".join(by_id.get(first, ["not run"]))
        reason = f"{passed} of {len(expected)} expected tests passed; {first}: {statuses}" + (
            f" ({problem})" if problem else "")
        return {"status": "failed", "reason": reason[:300], **counts}
    return {"status": "passed", "reason": "", **counts}


def judge(rfd: int, wfd: int, out_fd: int, secret: bytes, config: dict[str, Any]) -> None:
    """One verification: READY, the tests, one VERDICT, written to ``out_fd``."""
    if len(secret) < 16:
        raise SystemExit("judge: no secret")
    _write(out_fd, ready_line(secret) + "\n")
    link = Link(rfd, wfd, time.monotonic() + float(config["limit_s"]))
    verdict = run_tests(link, dict(config["tests"]), list(config["task_modules"]))
    text = json.dumps(verdict, sort_keys=True)
    _write(out_fd, verdict_line(secret, text) + "\n")


def _write(fd: int, text: str) -> None:
    view = memoryview(text.encode())
    while view:
        view = view[os.write(fd, view):]


def serve(sock_fd: int) -> None:
    """The kept judge (``judge_host.KeptJudge``): everything imported once; per request — a JSON
    message ``{"secret": hex, "config": {...}}`` with three descriptors (the server's stdout, its
    stdin, the output pipe) on the Unix socket ``sock_fd`` — fork a judge that writes its pid line,
    READY and VERDICT to the output pipe. Ends when the harness's end of the socket closes."""
    import signal
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # judges are reaped by the kernel
    try:  # imported once, as unittest is: pytest-style hidden tests (judge_pytest)
        import _pytest.python  # noqa: F401
        import pytest  # noqa: F401

        import drumsbench.envs.coding.judge_pytest  # noqa: F401
    except ImportError:
        pass
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            return
        if not msg:
            return
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                request = json.loads(msg)
                limit = float(request["config"]["limit_s"])
                signal.alarm(int(limit) + 5)  # a judge never outlives its verification
                _write(fds[2], f"DRUMSBENCH_JUDGE_PID {os.getpid()}\n")
                judge(fds[0], fds[1], fds[2], bytes.fromhex(request["secret"]), request["config"])
                code = 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(int(argv[1]))
        return
    secret = bytes.fromhex(sys.stdin.readline().strip())
    config = json.loads(sys.stdin.readline())
    judge(int(argv[0]), int(argv[1]), sys.stdout.fileno(), secret, config)


if __name__ == "__main__":
    main()
