"""The untrusted side of the trusted judge's boundary: runs the code under test, answers with data.

Run in the sandbox, as the sandbox's uid, with the work folder as cwd:
``python3 -I -c <this file's source>``. It is the **only** process that imports the policy's work
tree during a trusted verification; the hidden tests, the test framework, the result objects and
the verdict live in the judge (``judge.py``), a process on the host the policy's code never runs in.

Protocol: the judge writes one JSON request per line on the server's stdin; the server writes one
JSON answer per line on the stdout it had at start (fd 1 is pointed at stderr before any code of
the work tree runs, so the code under test's prints never mix with answers). Requests:
``{"op": OP, ...}`` with OP one of ``import`` (name), ``getattr`` (h, name), ``setattr`` (h, name,
v), ``call`` (h, a, kw), ``callattr`` (h, name, a, kw), ``str``/``repr``/``len``/``bool``/``list``
(h), ``getitem`` (h, k), ``contains`` (h, v), ``format`` (h, spec), ``isinstance`` (h: a class, v).
Answers: ``{"ok": VALUE}`` or ``{"err": {"mro": [qualified class names], "msg": text}}``.

Values are written by ``encode`` and read by ``decode`` (this module holds both, stdlib only, so
the judge reads exactly the format the server writes). **Plain data** crosses as itself: None,
bool, int, float, str, list as JSON; tuple ``$t``, set ``$s``, frozenset ``$fs``, dict ``$d`` (a
list of pairs), bytes ``$b`` (base64); the standard library's value types Decimal ``$dec``, Fraction
``$fr``, datetime ``$dt``, date ``$date``, time ``$time`` (naive or a fixed-offset ``timezone``),
timedelta ``$td``, timezone ``$tz`` — matched by exact type (a subclass is not plain: it crosses as a
handle). A dataclass instance crosses as a record ``$rec`` (its handle, its class's qualified name,
and its compared fields as values); an exception class as ``$xc`` (its MRO's names); an exception
instance as ``$xi``. Anything else crosses as an opaque handle ``$h`` (an index into this server's
table, with its type's name). Nothing the server writes is trusted by the judge beyond this format:
``decode`` there builds only plain data and the judge's own proxy objects.
"""

from __future__ import annotations  # annotations are text: nothing below imports typing at run time

import json
import os
import sys

TYPE_CHECKING = False  # the typing module's own flag, without importing it (the server starts per verification)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any, BinaryIO

    HandleOf = Callable[[object], int]

# base64, dataclasses, datetime, decimal and fractions are imported where a value needs them: the
# server starts per verification, and a value of one of their types means its module is loaded.

MAX_ITEMS = 100_000  # a list/iter answer longer than this is an error of the code under test
_TAGS = ("$t", "$s", "$fs", "$d", "$b", "$dec", "$fr", "$dt", "$date", "$time", "$td", "$tz", "$h", "$rec",
         "$xc", "$xi")


class BoundaryError(Exception):
    """A value that cannot cross the boundary, or a message that breaks the format."""


def _qualname(cls: object) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', getattr(cls, '__name__', '?'))}"


def _mro_names(cls: type) -> list[str]:
    return [_qualname(c) for c in cls.__mro__]


def _plain_tz(tz: object) -> bool:
    if tz is None:
        return True
    dt = sys.modules.get("datetime")
    return dt is not None and type(tz) is dt.timezone


def _loaded(module: str, name: str) -> Any:
    """``module.name`` when that module is loaded (a value of its type exists only then), else None."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def encode(value: Any, handle_of: HandleOf, depth: int = 0) -> Any:
    """``value`` as JSON-ready data; ``handle_of(obj)`` gives the handle number of a non-plain object
    (the server's table; the judge's proxies carry theirs)."""
    if depth > 100:
        raise BoundaryError("nested deeper than 100 levels")
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    d = depth + 1
    if t is list:
        return [encode(v, handle_of, d) for v in value]
    if t is tuple:
        return {"$t": [encode(v, handle_of, d) for v in value]}
    if t is set:
        return {"$s": [encode(v, handle_of, d) for v in value]}
    if t is frozenset:
        return {"$fs": [encode(v, handle_of, d) for v in value]}
    if t is dict:
        return {"$d": [[encode(k, handle_of, d), encode(v, handle_of, d)] for k, v in value.items()]}
    if t is bytes:
        import base64

        return {"$b": base64.b64encode(value).decode()}
    if t is _loaded("decimal", "Decimal"):
        return {"$dec": str(value)}
    if t is _loaded("fractions", "Fraction"):
        return {"$fr": [value.numerator, value.denominator]}
    if t is _loaded("datetime", "datetime") and _plain_tz(value.tzinfo):
        return {"$dt": value.isoformat()}
    if t is _loaded("datetime", "date"):
        return {"$date": value.isoformat()}
    if t is _loaded("datetime", "time") and _plain_tz(value.tzinfo):
        return {"$time": value.isoformat()}
    if t is _loaded("datetime", "timedelta"):
        return {"$td": [value.days, value.seconds, value.microseconds]}
    if t is _loaded("datetime", "timezone"):
        off = value.utcoffset(None)
        return {"$tz": [off.days, off.seconds, off.microseconds]}
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"$xc": _mro_names(value)}
    if isinstance(value, BaseException):
        return {"$xi": _mro_names(t), "msg": _text(value)}
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and not isinstance(value, type) and dataclasses.is_dataclass(value):
        fields = [[f.name, encode(getattr(value, f.name), handle_of, d)]
                  for f in dataclasses.fields(value) if f.compare]
        return {"$rec": handle_of(value), "cls": _qualname(t), "f": fields}
    return {"$h": handle_of(value), "type": _qualname(t)}


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:2000]
    except BaseException:
        return "<unprintable>"


def decode(data: Any, handle: Callable[[int, str], Any], record: Callable[[int, str, list[tuple[str, Any]]], Any],
           exc_class: Callable[[list[str]], type[BaseException]], depth: int = 0) -> Any:
    """The value ``data`` (parsed JSON) stands for; strict: anything outside the format raises
    ``BoundaryError``. ``handle(n, type_name)``, ``record(n, cls, fields)`` and ``exc_class(mro)``
    build the non-plain values of the decoding side."""
    if depth > 100:
        raise BoundaryError("nested deeper than 100 levels")
    if data is None or type(data) in (bool, int, float, str):
        return data
    d = depth + 1
    if type(data) is list:
        return [decode(v, handle, record, exc_class, d) for v in data]
    if type(data) is not dict or len(data) not in (1, 2, 3):
        raise BoundaryError(f"not a value: {type(data).__name__}")
    tag = next(iter(data))
    if tag not in _TAGS:
        raise BoundaryError(f"unknown tag {tag!r:.40}")
    arg = data[tag]
    try:
        if tag in ("$t", "$s", "$fs"):
            items = [decode(v, handle, record, exc_class, d) for v in _list(arg)]
            return tuple(items) if tag == "$t" else set(items) if tag == "$s" else frozenset(items)
        if tag == "$d":
            out: dict[Any, Any] = {}
            for pair in _list(arg):
                k, v = _list(pair, 2)
                out[decode(k, handle, record, exc_class, d)] = decode(v, handle, record, exc_class, d)
            return out
        if tag == "$b":
            import base64

            return base64.b64decode(_str(arg), validate=True)
        if tag == "$dec":
            import decimal

            return decimal.Decimal(_str(arg))
        if tag == "$fr":
            import fractions

            n, q = _list(arg, 2)
            return fractions.Fraction(_int(n), _int(q))
        if tag in ("$dt", "$date", "$time", "$td", "$tz"):
            import datetime

            if tag == "$dt":
                return datetime.datetime.fromisoformat(_str(arg))
            if tag == "$date":
                return datetime.date.fromisoformat(_str(arg))
            if tag == "$time":
                return datetime.time.fromisoformat(_str(arg))
            days, secs, micros = (_int(x) for x in _list(arg, 3))
            delta = datetime.timedelta(days=days, seconds=secs, microseconds=micros)
            return delta if tag == "$td" else datetime.timezone(delta)
        if tag == "$h":
            return handle(_int(arg), _str(data.get("type", "?")))
        if tag == "$rec":
            fields = [(_str(name), decode(v, handle, record, exc_class, d))
                      for name, v in (_list(p, 2) for p in _list(data.get("f")))]
            return record(_int(arg), _str(data.get("cls")), fields)
        if tag == "$xc":
            return exc_class([_str(n) for n in _list(arg)])
        if tag == "$xi":
            return exc_class([_str(n) for n in _list(arg)])(_str(data.get("msg", "")))
    except BoundaryError:
        raise
    except (ValueError, TypeError, ArithmeticError, OverflowError) as e:
        raise BoundaryError(f"bad {tag} value: {e}") from None
    raise BoundaryError(f"tag {tag} not decoded")


def _list(x: Any, n: int | None = None) -> list[Any]:
    if type(x) is not list or (n is not None and len(x) != n):
        raise BoundaryError("malformed list")
    return x


def _str(x: Any) -> str:
    if type(x) is not str:
        raise BoundaryError("malformed string")
    return x


def _int(x: Any) -> int:
    if type(x) is not int:
        raise BoundaryError("malformed integer")
    return x


# -- the server ----------------------------------------------------------------------------------------
class _Table:
    """Objects handed to the judge, by handle number (kept for the whole verification)."""

    def __init__(self) -> None:
        self.objects: list[object] = []
        self.numbers: dict[int, int] = {}

    def handle_of(self, obj: object) -> int:
        n = self.numbers.get(id(obj))
        if n is None or self.objects[n] is not obj:
            n = len(self.objects)
            self.objects.append(obj)
            self.numbers[id(obj)] = n
        return n

    def get(self, n: object) -> Any:
        if type(n) is not int or not 0 <= n < len(self.objects):
            raise BoundaryError(f"no handle {n!r}")
        return self.objects[n]


class _ServerExc(Exception):
    """The judge handed back an exception value: the server never builds the judge's classes."""


def serve(rfile: Iterable[bytes], out_fd: int) -> None:
    table = _Table()

    def value(data: Any) -> Any:
        return decode(data, lambda n, _t: table.get(n), lambda n, _c, _f: table.get(n),
                      lambda _mro: _ServerExc)

    def answer(obj: Any) -> None:
        line = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode() + b"\n"
        view = memoryview(line)
        while view:
            view = view[os.write(out_fd, view):]

    ops: dict[str, Callable[[dict[str, Any]], Any]] = {
        "import": lambda r: __import__(r["name"], fromlist=["_"]) if "." in r["name"] else __import__(r["name"]),
        "getattr": lambda r: getattr(table.get(r["h"]), r["name"]),
        "setattr": lambda r: setattr(table.get(r["h"]), r["name"], value(r["v"])),
        "call": lambda r: table.get(r["h"])(*value(r["a"]), **value(r["kw"])),
        "callattr": lambda r: getattr(table.get(r["h"]), r["name"])(*value(r["a"]), **value(r["kw"])),
        "str": lambda r: str(table.get(r["h"])),
        "repr": lambda r: repr(table.get(r["h"])),
        "len": lambda r: len(table.get(r["h"])),
        "bool": lambda r: bool(table.get(r["h"])),
        "list": lambda r: _bounded_list(table.get(r["h"])),
        "getitem": lambda r: table.get(r["h"])[value(r["k"])],
        "contains": lambda r: value(r["v"]) in table.get(r["h"]),
        "format": lambda r: format(table.get(r["h"]), r["spec"]),
        "isinstance": lambda r: isinstance(value(r["v"]), table.get(r["h"])),
    }
    for line in rfile:
        try:
            req = json.loads(line)
            result = ops[req["op"]](req)
            out = {"ok": encode(result, table.handle_of)}
        except BaseException as e:
            out = {"err": {"mro": _mro_names(type(e)), "msg": _text(e)}}
        try:
            answer(out)
        except BaseException as e:
            answer({"err": {"mro": _mro_names(type(e)), "msg": _text(e)}})


def _bounded_list(obj: Any) -> list[Any]:
    out: list[Any] = []
    for item in obj:
        out.append(item)
        if len(out) > MAX_ITEMS:
            raise BoundaryError(f"more than {MAX_ITEMS} items")
    return out


def main() -> None:
    out_fd = os.dup(1)
    os.dup2(2, 1)  # the code under test's prints go to stderr, never into the answers
    sys.stdout = sys.stderr
    os.set_inheritable(out_fd, False)
    sys.path.insert(0, os.getcwd())
    rfile = os.fdopen(os.dup(0), "rb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the code under test's stdin is empty
    serve(_lines(rfile), out_fd)


def _lines(f: BinaryIO) -> Iterator[bytes]:
    buf = b""
    while True:
        chunk = f.read(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line


def zygote_main(work_dir: str, uid: int, sock_fd: int) -> None:
    """``python3 -I -c <this source> --zygote WORK UID SOCK``: the boundary server kept warm.

    Started by the harness through the sandbox's ``Helpers`` (as the harness's uid, in the
    sandbox's cgroups, spared by ``end_processes``; the sandbox's uid cannot signal or trace it),
    with one end of a Unix socket. It holds no secret and never imports the work tree. Per request
    (two descriptors: the server's stdin and stdout) it forks a server that leaves its session,
    drops to ``uid`` for good (no other descriptor, no supplementary group, an ordinary OOM score),
    enters ``work_dir`` and runs ``main``; the zygote answers with a pidfd of the server, opened
    before the server can have been reaped (so the harness never signals a reused pid). It saves the
    interpreter's start and the codec's imports per verification. Ends at the socket's EOF."""
    import signal
    import socket

    def reap(_sig: int, _frame: object) -> None:
        while True:
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not done:
                return

    signal.signal(signal.SIGCHLD, reap)
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 2)
        except OSError:
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if not _msg:
                return
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # not reaped before its pidfd is open
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                os.setsid()
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # not the helper's channel to the harness
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("0")
                os.closerange(3, 65536)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid or os.getegid() != uid:
                    raise SystemExit("zygote: could not drop to the sandbox's uid")
                os.chdir(work_dir)
                main()
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        try:
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
        except OSError:
            return
        finally:
            os.close(pidfd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        zygote_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
