"""The trusted judge's boundary, on its own: what crosses, what the judge refuses, how it compares.

The codec is pure data: these tests feed the judge's decoder what a hostile server could write and
check it builds only plain data and the judge's own proxies. The judge's end-to-end contract (a real
boundary server in a real sandbox) is in test_judge.py.
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from drumsbench.envs.coding import boundary_server as bs
from drumsbench.envs.coding.judge import Link, Remote, RemoteRecord, ServerLost


def _link() -> Link:
    return Link(-1, -1, time.monotonic() + 60)


def _decode(link: Link, data: object) -> object:
    return link.decode(json.loads(json.dumps(data)))


def test_plain_values_cross_as_themselves() -> None:
    link = _link()
    values = [None, True, 3, -2.5, "x", [1, "a"], (1, (2,)), {1, 2}, frozenset({"a"}), {"k": [1]},
              b"\x00\xff", decimal.Decimal("0.125"), fractions.Fraction(1, 3),
              datetime.datetime(2024, 5, 1, 9, tzinfo=datetime.UTC), datetime.date(2024, 5, 1),
              datetime.time(9, 30), datetime.timedelta(days=-1, seconds=5),
              datetime.timezone(datetime.timedelta(hours=2))]
    table: list[object] = []
    for v in values:
        got = _decode(link, bs.encode(v, lambda o: table.append(o) or len(table) - 1))
        assert got == v and type(got) is type(v), (v, got)
    assert table == [], "a plain value was handed out as a handle"


def test_a_subclass_of_a_plain_type_is_a_handle_never_compared() -> None:
    class Always(decimal.Decimal):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = decimal.Decimal.__hash__

    table: list[object] = []
    data = bs.encode(Always("1"), lambda o: table.append(o) or len(table) - 1)
    assert "$h" in data and table
    got = _decode(_link(), data)
    assert isinstance(got, Remote) and not isinstance(got, RemoteRecord)
    with pytest.raises(bs.BoundaryError, match="compared"):
        assert got == decimal.Decimal("2")
    with pytest.raises(bs.BoundaryError):
        assert decimal.Decimal("2") == got  # reflected: the handle's refusal, not Decimal's answer
    with pytest.raises(bs.BoundaryError):
        assert got < 3  # type: ignore[operator]


def test_records_compare_here_by_class_name_and_fields() -> None:
    link = _link()
    rec = {"$rec": 1, "cls": "intervals.interval.Interval", "f": [["start", 1], ["end", 2]]}
    a, b = _decode(link, rec), _decode(link, {**rec, "$rec": 2})
    c = _decode(link, {**rec, "f": [["start", 1], ["end", 3]]})
    d = _decode(link, {**rec, "cls": "other.Interval"})
    assert isinstance(a, RemoteRecord)
    assert a == b and a != c and a != d and a != (1, 2)
    assert repr(a) == "Interval(start=1, end=2)"
    assert [a] == [b]


@pytest.mark.parametrize("data", [
    {"$x": 1}, {"a": 1, "b": 2, "c": 3, "d": 4}, {"$t": "notalist"}, {"$d": [[1]]}, {"$b": "!!"},
    {"$dec": 5}, {"$dt": "not a date"}, {"$td": [1, 2]}, {"$h": "7"}, {"$rec": 1, "cls": 3, "f": []},
    {"$xc": "builtins.ValueError"}, {"$fr": [1, 0]},
])
def test_the_decoder_refuses_what_is_not_the_format(data: object) -> None:
    with pytest.raises(bs.BoundaryError):
        _decode(_link(), data)


def test_nesting_is_bounded() -> None:
    data: object = 1
    for _ in range(150):
        data = {"$t": [data]}
    with pytest.raises(bs.BoundaryError, match="nested"):
        _decode(_link(), data)


def test_exceptions_become_the_judges_own_classes() -> None:
    link = _link()
    err = link.exc_class(["invoice.errors.InvoiceError", "builtins.ValueError", "builtins.Exception",
                          "builtins.BaseException", "builtins.object"])
    assert issubclass(err, ValueError)
    assert (err.__module__, err.__qualname__) == ("invoice.errors", "InvoiceError")
    assert link.exc_class(["invoice.errors.InvoiceError"]) is err
    assert link.exc_class(["builtins.KeyError", "builtins.LookupError"]) is KeyError
    exit_cls = link.exc_class(["builtins.SystemExit", "builtins.BaseException"])
    assert issubclass(exit_cls, Exception), "SystemExit of the code under test must be a test's error"


def _server() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-c", bs.__loader__.get_source(bs.__name__) or ""],  # type: ignore[union-attr]
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/")


def test_requests_round_trip_and_a_dead_server_ends_the_link() -> None:
    """The real server source, as a child process: forwarded calls, the code under test's
    exception, a handle it hands out; then the server killed mid-verification -> ServerLost."""
    srv = _server()
    assert srv.stdin is not None and srv.stdout is not None
    link = Link(srv.stdout.fileno(), srv.stdin.fileno(), time.monotonic() + 30)
    try:
        dec = link.request("import", name="decimal")
        assert isinstance(dec, Remote)
        assert dec.Decimal("1.5") == decimal.Decimal("1.5")  # exact type: plain, rebuilt here
        with pytest.raises(decimal.InvalidOperation) as info:  # the judge's own class of that name
            dec.Decimal("x")
        assert getattr(info.value, "drumsbench_remote", False)
        coll = link.request("import", name="collections")
        counter = coll.Counter("abca")
        assert isinstance(counter, Remote) and len(counter) == 3 and "a" in counter
        assert sorted(counter) == ["a", "b", "c"] and counter["a"] == 2
        with pytest.raises(bs.BoundaryError, match="cannot hand"):
            coll.Counter(object())
        srv.kill()
        srv.wait()
        with pytest.raises(ServerLost):
            coll.Counter("x")
        with pytest.raises(ServerLost):  # and stays lost
            coll.Counter("y")
        assert link.lost
    finally:
        srv.kill()
        srv.wait()


def test_garbage_and_a_silent_server_end_the_verification_not_the_judge() -> None:
    r1, w1 = os.pipe()  # server -> judge
    r2, w2 = os.pipe()  # judge -> server
    try:
        link = Link(r1, w2, time.monotonic() + 1.0)

        def answer(data: bytes) -> None:
            os.read(r2, 65536)
            os.write(w1, data)

        t = threading.Thread(target=answer, args=(b'{"ok": {"$evil": 1}}\n',))
        t.start()
        with pytest.raises(ServerLost, match="format"):
            link.request("import", name="x")
        t.join()
        link2 = Link(r1, w2, time.monotonic() + 0.5)
        t0 = time.monotonic()
        with pytest.raises(ServerLost, match="time limit"):
            link2.request("import", name="x")  # nobody answers
        assert time.monotonic() - t0 < 5
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
