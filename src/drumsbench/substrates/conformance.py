"""The self-check every substrate must pass.

Each check takes a fresh ``Substrate`` instance (one run) and raises ``ConformanceFailure`` with
what it expected. ``run_all`` runs every check and returns (name, None | failure message) pairs;
the test suite runs it for every registered substrate, and ``drumsbench conformance`` runs it
from the command line for a plugin author.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from drumsbench.core.errors import SubstrateError
from drumsbench.core.fingerprint import files_digest
from drumsbench.substrates.base import (
    Forking,
    Freezable,
    HostFolders,
    ResetStrategy,
    Sandbox,
    SandboxFrozen,
    Snapshotting,
    Substrate,
)


class ConformanceFailure(AssertionError):
    pass


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise ConformanceFailure(message)


@contextmanager
def sandbox(sub: Substrate) -> Iterator[Sandbox]:
    box = sub.create()
    try:
        yield box
    finally:
        box.destroy()


def check_exit_codes(sub: Substrate) -> None:
    with sandbox(sub) as box:
        for cmd, code in (("true", 0), ("false", 1), ("exit 42", 42), ("no-such-cmd-xyz", 127)):
            res = box.exec(cmd, timeout=10)
            expect(res.exit_code == code and not res.timed_out, f"{cmd!r}: exit {res.exit_code}, want {code}")


def check_streams(sub: Substrate) -> None:
    with sandbox(sub) as box:
        res = box.exec("printf out; printf err >&2; printf '\\377\\000x'", timeout=10)
        expect(res.stdout == b"out\xff\x00x", f"stdout {res.stdout!r}: bytes must pass unchanged")
        expect(res.stderr == b"err", f"stderr {res.stderr!r}")
        res = box.exec(["sh", "-c", 'printf "%s|%s" "$1" "$2"', "sh", "a b", "c'd"], timeout=10)
        expect(res.stdout == b"a b|c'd", f"argv form must not re-split arguments: {res.stdout!r}")
        res = box.exec("cat", timeout=10, stdin=b"hello\n")
        expect(res.stdout == b"hello\n", f"stdin not delivered: {res.stdout!r}")


def check_output_bounded(sub: Substrate) -> None:
    with sandbox(sub) as box:
        res = box.exec("head -c 3000000 /dev/zero", timeout=20, output_limit=1000)
        expect(len(res.stdout) == 1000, f"kept {len(res.stdout)} bytes, limit 1000")
        expect(res.stdout_total == 3_000_000 and res.truncated, f"total {res.stdout_total}, want 3000000")
        expect(res.exit_code == 0, f"exit {res.exit_code}")
        res = box.exec("head -c 100000 /dev/zero; echo END", timeout=20, output_limit=1000)
        expect(res.stdout.endswith(b"\0END\n"), "the last bytes of a long output must be kept")


def _unique_sleep() -> str:
    """A sleep whose command line no other process on the host has (the process substrate sees all)."""
    return f"sleep 60.{random.randrange(10**6):06d}"


def _survivors(box: Sandbox, sleep: str) -> bytes:
    probe = box.exec(f"ps -eo args 2>/dev/null | grep -c '^{sleep}' || true", timeout=10)
    return probe.stdout.strip()


def check_timeout_kills(sub: Substrate) -> None:
    with sandbox(sub) as box:
        t0 = time.monotonic()
        sleep = _unique_sleep()
        res = box.exec(f"{sleep} & {sleep}", timeout=0.5)
        took = time.monotonic() - t0
        expect(res.timed_out, "a command past its timeout must report timed_out")
        expect(took < 5, f"timeout of 0.5 s took {took:.1f} s")
        left = _survivors(box, sleep)
        expect(left in (b"0", b""), f"processes of the timed-out command survive: {left!r}")
        res = box.exec("echo alive", timeout=10)
        expect(res.stdout == b"alive\n", "the sandbox must stay usable after a timeout")


def check_end_processes(sub: Substrate) -> None:
    """``end_processes`` (the rollout calls it before staging every verifier) kills what a command
    left running in the background, keeps the sandbox's files and leaves it usable; ``probe`` finds
    no evidence against a live sandbox, before and after. A substrate without them passed every
    other check and failed at its first coding attempt."""
    with sandbox(sub) as box:
        expect(box.probe() is None, "probe of a live sandbox must find nothing (None)")
        box.write_file(f"{box.paths.work}/kept.txt", b"kept")
        sleep = _unique_sleep()
        box.exec(f"({sleep} > /dev/null 2>&1 &)", timeout=10)
        before = _survivors(box, sleep)  # 0 where each command has a pid namespace of its own (bwrap)
        expect(before in (b"0", b"1", b""), f"one background sleep at most: ps counts {before!r}")
        try:
            box.end_processes()
        except NotImplementedError as e:
            raise ConformanceFailure(f"end_processes: {e} (the rollout calls it before every verification)") from e
        left = _survivors(box, sleep)
        expect(left in (b"0", b""), f"a background process survives end_processes: {left!r}")
        expect(box.read_file(f"{box.paths.work}/kept.txt") == b"kept", "end_processes must keep the files")
        res = box.exec("echo alive", timeout=10)
        expect(res.stdout == b"alive\n", "the sandbox must stay usable after end_processes")
        expect(box.probe() is None, "probe after end_processes must find nothing (None)")


def check_freeze(sub: Substrate) -> None:
    """A ``Freezable`` sandbox (fault injection freezes it as a host stall would): once frozen,
    ``probe`` has evidence (the gate's only witness of the stall) and a command does not run — it
    times out or is refused (``SandboxFrozen``); ``thaw`` (twice: idempotent) gives back a sandbox
    whose ``probe`` finds nothing and whose commands run, with its files. Other sandboxes: nothing."""
    with sandbox(sub) as box:
        if not isinstance(box, Freezable):  # (process, bwrap, overlay: only with a cgroup of their own)
            return
        box.write_file(f"{box.paths.work}/kept.txt", b"kept")
        box.freeze()
        try:
            evidence = box.probe()
            expect(evidence is not None, "probe of a frozen sandbox must give evidence (the stall is the host's)")
            try:
                res = box.exec("echo ran", timeout=2)
            except SandboxFrozen:
                pass
            else:
                expect(res.timed_out, f"a command ran in a frozen sandbox: exit {res.exit_code}, {res.stdout!r}")
        finally:
            box.thaw()
        box.thaw()
        after_thaw = box.probe()
        expect(after_thaw is None, f"probe after thaw must find nothing, found: {after_thaw}")
        res = box.exec("cat kept.txt", timeout=30)
        expect(res.stdout == b"kept", f"after thaw a command must run and see the files: {res!r}")


def check_cwd_env(sub: Substrate) -> None:
    with sandbox(sub) as box:
        res = box.exec('pwd; echo "$FOO"; echo "$HOME"; echo "$TMPDIR"', timeout=10, env={"FOO": "bar"})
        lines = res.stdout.decode().splitlines()
        expect(lines[0] == box.paths.work, f"default cwd {lines[0]!r}, want {box.paths.work!r}")
        expect(lines[1] == "bar", "extra env not passed")
        expect(lines[2] == box.paths.home, f"HOME {lines[2]!r}, want {box.paths.home!r}")
        expect(lines[3] == box.paths.tmp, f"TMPDIR {lines[3]!r}, want {box.paths.tmp!r}")
        res = box.exec("pwd", timeout=10, cwd=box.paths.home)
        expect(res.stdout.decode().strip() == box.paths.home, "cwd argument ignored")


def check_files(sub: Substrate) -> None:
    with sandbox(sub) as box:
        data = bytes(range(256)) * 100
        path = f"{box.paths.work}/deep/er/file.bin"
        box.write_file(path, data)
        expect(box.read_file(path) == data, "read_file must return exactly what write_file wrote")
        expect(box.read_file(path, limit=10) == data[:10], "read_file limit ignored")
        res = box.exec("wc -c < deep/er/file.bin", timeout=10)
        expect(res.stdout.strip() == b"25600", f"the command sees {res.stdout!r} bytes, want 25600")
        box.exec("printf made > made.txt", timeout=10)
        expect(box.read_file(f"{box.paths.work}/made.txt") == b"made", "files made by commands not readable")
        try:
            box.read_file(f"{box.paths.work}/missing")
        except FileNotFoundError:
            pass
        else:
            raise ConformanceFailure("reading a missing file must raise FileNotFoundError")


def check_digest_and_scan(sub: Substrate) -> None:
    with sandbox(sub) as box:
        files = {"a.py": b"print(1)\n", "pkg/b.py": b"x = 2\n", "pkg/sub/c.txt": b"TOKEN-1 here"}
        box.put_files(box.paths.work, files)
        expect(box.tree_digest(box.paths.work) == files_digest(files), "tree_digest differs from files_digest")
        hits = box.scan([box.paths.work, box.paths.home], ["TOKEN-1", "TOKEN-2"])
        expect(hits == {"TOKEN-1"}, f"scan found {hits}, want {{'TOKEN-1'}}")


def check_separate_sandboxes(sub: Substrate) -> None:
    with sandbox(sub) as a, sandbox(sub) as b:
        a.write_file(f"{a.paths.work}/only-a", b"a")
        res = b.exec("ls", timeout=10, cwd=b.paths.work)
        expect(b"only-a" not in res.stdout, "a file written in one sandbox appears in another")


_PROBE = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 5).close()\n    print('reached')\n"
          "except OSError as e:\n    print('blocked:', e)\n")


def check_no_host_loopback(sub: Substrate) -> None:
    """A substrate that declares no network (``capabilities.network`` False) keeps its sandboxes off
    the host's loopback: a listener on the host's 127.0.0.1 (as the service, Ray or an inference
    endpoint listen) is out of a sandbox's reach, while a plain host process reaches it (the check's
    positive control, run first)."""
    if sub.capabilities.network:
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        probe = _PROBE.format(port=listener.getsockname()[1])
        host = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, timeout=30, check=False)
        expect(host.stdout.startswith(b"reached"), f"positive control: a host process did not reach the listener "
               f"({host.stdout!r})")
        with sandbox(sub) as box:
            box.write_file(f"{box.paths.work}/probe.py", probe.encode())
            res = box.exec("python3 -I probe.py 2>&1", timeout=30, cwd=box.paths.work)
        expect(res.stdout.startswith(b"blocked:"), f"a sandbox of a substrate without network reached (or did not "
               f"try) a listener on the host's 127.0.0.1: {res.stdout[:200]!r}")


def check_parallel_exec(sub: Substrate) -> None:
    with sandbox(sub) as box:
        results: list[bytes] = []

        def run(i: int) -> None:
            results.append(box.exec(f"sleep 0.3; echo {i}", timeout=10).stdout)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        expect(sorted(results) == [b"0\n", b"1\n", b"2\n"], f"parallel results {results}")
        expect(time.monotonic() - t0 < 2.5, "execs in one sandbox must run concurrently")


def check_reset_in_place(sub: Substrate) -> None:
    if ResetStrategy.IN_PLACE not in sub.capabilities.reset_strategies:
        return
    with sandbox(sub) as box:
        box.write_file(f"{box.paths.work}/f", b"1")
        box.write_file(f"{box.paths.home}/g", b"1")
        sleep = _unique_sleep()
        box.exec(f"({sleep} > /dev/null 2>&1 &)", timeout=10)
        box.reset_in_place()
        res = box.exec("ls -A; ls -A \"$HOME\"", timeout=10)
        expect(res.stdout == b"", f"work/home not empty after in-place reset: {res.stdout!r}")
        expect(_survivors(box, sleep) in (b"0", b""), "processes survive an in-place reset")


def check_capabilities_declared(sub: Substrate) -> None:
    """What a substrate declares matches the interfaces it implements (never found by ``hasattr``)."""
    forking = isinstance(sub, Forking)
    expect(sub.capabilities.snapshot == forking,
           f"capabilities.snapshot is {sub.capabilities.snapshot} but the substrate is {'' if forking else 'not '}"
           "Forking")
    with sandbox(sub) as box:  # one sandbox for every declaration
        declared = type(sub).sandbox_class
        expect(declared is None or isinstance(box, declared),
               f"create() made a {type(box).__name__}, not the declared sandbox_class {declared}")
        if forking:
            expect(isinstance(box, Snapshotting), "a Forking substrate's sandboxes must be Snapshotting")
        if isinstance(box, HostFolders):
            box.write_file(f"{box.paths.work}/hf", b"seen from the host")
            expect(box.host_path(f"{box.paths.work}/hf").read_bytes() == b"seen from the host",
                   "HostFolders: host_path does not show the sandbox's file")
            try:
                box.host_path("/etc/passwd")
            except SubstrateError:
                pass
            else:
                raise ConformanceFailure("HostFolders: host_path must refuse a path outside the sandbox")


def check_snapshot_fork(sub: Substrate) -> None:
    """A fork starts from the snapshot's files, and fork and parent are separate afterwards."""
    if not isinstance(sub, Forking):
        return
    with sandbox(sub) as box:
        assert isinstance(box, Snapshotting)
        box.write_file(f"{box.paths.work}/state.txt", b"before")
        snap = box.snapshot()
        expect(snap in sub.snapshots(), "snapshot id not listed by snapshots()")
        box.write_file(f"{box.paths.work}/state.txt", b"parent after")
        child = sub.fork(snap)
        try:
            expect(child.read_file(f"{child.paths.work}/state.txt") == b"before",
                   "a fork must start from the snapshot, not from the parent's later state")
            child.write_file(f"{child.paths.work}/state.txt", b"child")
            expect(box.read_file(f"{box.paths.work}/state.txt") == b"parent after", "a fork's write reached its parent")
        finally:
            child.destroy()
        sub.drop_snapshot(snap)
        expect(snap not in sub.snapshots(), "drop_snapshot left the snapshot listed")


def check_destroy(sub: Substrate) -> None:
    box = sub.create()
    box.exec("(sleep 60 > /dev/null 2>&1 &)", timeout=10)
    box.destroy()
    box.destroy()  # idempotent
    try:
        box.exec("true", timeout=5)
    except SubstrateError:
        pass
    else:
        raise ConformanceFailure("exec on a destroyed sandbox must raise SubstrateError")
    left = sub.leftovers()
    expect(not left, f"left after destroy: {left}")


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Substrate], None]


CHECKS = [
    Check(f.__name__.removeprefix("check_"), f)
    for f in (
        check_exit_codes,
        check_streams,
        check_output_bounded,
        check_timeout_kills,
        check_end_processes,
        check_freeze,
        check_cwd_env,
        check_files,
        check_digest_and_scan,
        check_separate_sandboxes,
        check_no_host_loopback,
        check_parallel_exec,
        check_reset_in_place,
        check_capabilities_declared,
        check_snapshot_fork,
        check_destroy,
    )
]


def run_all(make: Callable[[], Substrate]) -> list[tuple[str, str | None]]:
    """Run every check on a fresh substrate instance; (check name, failure or None)."""
    out: list[tuple[str, str | None]] = []
    for check in CHECKS:
        sub = make()
        try:
            check.run(sub)
            out.append((check.name, None))
        except (ConformanceFailure, SubstrateError) as e:
            out.append((check.name, f"{type(e).__name__}: {e}"))
        finally:
            sub.close()
    return out
