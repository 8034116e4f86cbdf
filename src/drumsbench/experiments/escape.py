"""Escape attempts: what a substrate really contains, probed from inside real sandboxes.

Each probe runs commands in a sandbox as a task would and checks the effect from the host:

| probe | done inside the sandbox | contained when |
|---|---|---|
| write_outside | write a token into the host's /tmp and beside the sandbox folder | no token file appears on the host |
| read_neighbour | read another live sandbox's secret file (in-sandbox and host paths) | the secret is not printed |
| host_loopback | connect to a TCP port the host listens on at 127.0.0.1 | the host accepts no connection |
| network | list interfaces; compare network namespace and kernel with the host's | only `lo`, own namespace |
| fill_disk | write up to ``disk_mb`` MiB into the sandbox's tmp | a limit cuts the write short |
| fork_bomb | start up to ``procs`` sleeping processes | a fork fails before that (a process limit) |
| memory_hog | allocate and touch up to ``mem_mb`` MiB | the allocation fails or the hog is killed (a memory limit) |

Nothing here is assumed: every probe says whether it **ran** — reached its check with the tools it
needs (a missing command, a sandbox that would not start, a crash or a timeout before the check
all mean it did not run, and it is never reported as contained). Every probe also has a
**positive control**: the same probe in ``HostControlSandbox``es, folders on the host whose
commands run as the harness itself, where nothing isolates and so every escape must succeed
(bounded: the fill is ``disk_mb`` MiB and refused when the host disk is short, the fork bomb
``procs`` 20-second sleeps that the probe kills; ``process`` is no longer a control because it may
run each sandbox as its own uid). The control *fires* when the probe ran there and reported "not
contained". A limit is recognised only by its own sign (ENOSPC, EDQUOT, EFBIG/SIGXFSZ; a failed
fork): a write or fork that stopped for any other reason is "did not run". The verdict per probe:

- ``did not run``: the probe did not reach its check (the detail says why);
- ``NOT contained``: the escape worked (this needs no control: it was seen);
- ``contained``: the escape failed *and* the control fired;
- ``unconfirmed``: the escape failed but the control did not fire (or was not run), so "failed"
  may be the probe's own blindness.

Network traffic goes only to 127.0.0.1 (host_loopback); the network probe sends none.

**Bounds** (``probe_bounds``): the three resource probes sized just above a substrate's own limit
(``Substrate.limits``), run in the substrate's sandboxes with the limits on and again with them off.
The limits-off run is the bound's positive control (the probe exceeds the bound there); a bound is
``bounded`` only when the limits-on run was stopped *by its limit* and the control exceeded it. The
fill also records the free space of the host's file system (the one holding the sandbox folder, or
``/``) before and while the sandbox was full: a sandbox that hits ENOSPC must leave the host's
file system with room.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    SANDBOX_FOLDERS,
    ExecRequest,
    ExecResult,
    HostFolders,
    Sandbox,
    SandboxPaths,
    Substrate,
)
from drumsbench.substrates.exec_core import SANDBOX_PATH, ProcessGroups
from drumsbench.substrates.hostproc import kill_pids, pids_with_env

PROBES = ("write_outside", "read_neighbour", "host_loopback", "network", "fill_disk", "fork_bomb", "memory_hog")
BOUND_PROBES = {"pids": "fork_bomb", "memory_mb": "memory_hog", "disk_mb": "fill_disk"}

MISSING = "DRUMSBENCH-MISSING"
DONE = "DRUMSBENCH-DONE"
# A shell function every probe script starts with: stop (and say so) when a command is absent.
_NEED = (f'need() {{ for t in "$@"; do command -v "$t" >/dev/null 2>&1 || {{ echo "{MISSING} $t"; exit 0; }}; '
         "done; }; ")


@dataclass(frozen=True)
class ProbeResult:
    probe: str
    ran: bool  # the probe reached its check; False: it says nothing about containment
    contained: bool | None  # None when it did not run
    detail: str
    control: str = "not run"  # "fired", "did not fire" or "not run": the same probe on `process`
    control_detail: str = ""

    @property
    def verdict(self) -> str:
        if not self.ran:
            return "did not run"
        if not self.contained:
            return "NOT contained"
        return "contained" if self.control == "fired" else "unconfirmed"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _not_run(probe: str, why: str) -> ProbeResult:
    return ProbeResult(probe, False, None, why)


def _text(b: bytes) -> str:
    return b.decode(errors="replace")


def _unfinished(res: ExecResult) -> str | None:
    """Why a probe script did not reach its check, or None when it did."""
    out = _text(res.stdout)
    m = re.search(rf"^{MISSING} (\S+)", out, re.M)
    if m:
        return f"did not run: command {m.group(1)!r} is missing in the sandbox"
    if res.timed_out:
        return f"did not run: timed out after {res.duration_s:.0f} s before its check"
    if not re.search(rf"^{DONE}$", out, re.M):
        tail = (_text(res.stderr).strip() or out.strip())[-160:]
        return f"did not run: exited {res.exit_code} before its check: {tail or 'no output'}"
    return None


def _script(need: str, body: str) -> str:
    return f"{_NEED}need {need}; {body}; echo; echo {DONE}"


def _write_outside(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None) -> ProbeResult:
    token = f"escape-{secrets.token_hex(6)}"
    targets = [f"/tmp/drumsbench-{token}", f"{box.paths.root}/../drumsbench-{token}"]
    own = f"{box.paths.tmp}/drumsbench-{token}"  # the self-check: a write the probe may do
    body = "; ".join(f"(echo {token} > {shlex.quote(t)}) 2>/dev/null" for t in [*targets, own])
    res = box.exec(_script("echo", body), timeout=20, env=env)
    host_root = box.host_root if isinstance(box, HostFolders) else None
    candidates = [Path(f"/tmp/drumsbench-{token}")]
    if host_root is not None:
        candidates.append(Path(str(host_root)).parent / f"drumsbench-{token}")
    found = [p for p in dict.fromkeys(candidates) if p.exists()]
    for p in found:
        p.unlink(missing_ok=True)
    if found:
        return ProbeResult("write_outside", True, False, f"host files written: {[str(p) for p in found]}")
    why = _unfinished(res)
    if why:
        return _not_run("write_outside", why)
    try:
        wrote_own = box.read_file(own).strip() == token.encode()
    except (FileNotFoundError, SubstrateError):
        wrote_own = False
    if not wrote_own:
        return _not_run("write_outside", "did not run: the sandbox could not write even its own tmp")
    return ProbeResult("write_outside", True, True, "host files written: none")


def _read_neighbour(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None) -> ProbeResult:
    secret = f"SECRET-{secrets.token_hex(8)}"
    mine = f"MINE-{secrets.token_hex(8)}"  # the self-check: the sandbox reads its own file
    other.write_file(f"{other.paths.work}/secret.txt", secret.encode())
    box.write_file(f"{box.paths.work}/mine.txt", mine.encode())
    paths = [f"{box.paths.work}/mine.txt", f"{other.paths.work}/secret.txt"]
    host_root = other.host_root if isinstance(other, HostFolders) else None
    if host_root is not None:
        paths.append(f"{host_root}/work/secret.txt")
    res = box.exec(_script("cat", "; ".join(f"cat {shlex.quote(p)} 2>/dev/null" for p in paths)), timeout=20, env=env)
    if secret.encode() in res.stdout:
        return ProbeResult("read_neighbour", True, False, "neighbour's secret read")
    why = _unfinished(res)
    if why:
        return _not_run("read_neighbour", why)
    if mine.encode() not in res.stdout:
        return _not_run("read_neighbour", "did not run: the sandbox could not read even its own file")
    return ProbeResult("read_neighbour", True, True, "neighbour unreadable")


def _host_loopback(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None) -> ProbeResult:
    accepted: list[str] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
                accepted.append(str(addr))
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    code = ("import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), 2).close(); print('connected')\n"
            "except OSError as e:\n    print('refused:', e)\n")
    try:
        res = box.exec(_script("python3", f"python3 -c {shlex.quote(code)}"), timeout=20, env=env)
    finally:
        stop.set()
        t.join()
        srv.close()
    why = _unfinished(res)
    if why and not accepted:
        return _not_run("host_loopback", why)
    if not accepted and not re.search(r"^(connected|refused:)", _text(res.stdout), re.M):
        return _not_run("host_loopback", f"did not run: python3 did not try to connect: "
                                         f"{(_text(res.stderr).strip() or 'no output')[-160:]}")
    return ProbeResult("host_loopback", True, not accepted,
                       f"host port 127.0.0.1:{port} accepted {len(accepted)} connection(s) from the sandbox")


def _host_identity() -> tuple[str, str]:
    """(network namespace, boot id) of this host process."""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return netns, boot


def _network(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None) -> ProbeResult:
    body = ("cat /proc/net/dev; echo \"NETNS $(readlink /proc/self/ns/net 2>/dev/null)\"; "
            "echo \"BOOT $(cat /proc/sys/kernel/random/boot_id 2>/dev/null)\"")
    res = box.exec(_script("cat", body), timeout=20, env=env)
    why = _unfinished(res)
    if why:
        return _not_run("network", why)
    lines = _text(res.stdout).splitlines()
    if not any(ln.startswith("Inter-|") for ln in lines):
        return _not_run("network", "did not run: /proc/net/dev could not be read in the sandbox")
    names = [ln.split(":")[0].strip() for ln in lines if ":" in ln and not ln.startswith(("NETNS", "BOOT"))
             and "|" not in ln]
    field = {ln.split(" ", 1)[0]: ln.partition(" ")[2].strip() for ln in lines if ln.startswith(("NETNS ", "BOOT "))}
    host_netns, host_boot = _host_identity()
    shares = bool(field.get("NETNS")) and field.get("NETNS") == host_netns and \
        bool(field.get("BOOT")) and field.get("BOOT") == host_boot
    others = [n for n in names if n != "lo"]
    detail = f"interfaces: {', '.join(names) or 'none'}; " + (
        "shares the host's network namespace" if shares else
        "own network namespace" if field.get("NETNS") else "network namespace unknown")
    return ProbeResult("network", True, not others and not shares, detail)


_LIMIT_SIGNS = ("No space left", "Disk quota exceeded", "File too large", "File size limit exceeded")


def _fill_disk(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None, disk_mb: int,
               keep: bool = False, timeout: float = 90.0) -> ProbeResult:
    # The sandbox may write to this host's disk (a host folder, a container layer): never fill it.
    free_mb = _host_free_mb(box)
    if free_mb < 4 * disk_mb + 1024:
        return _not_run("fill_disk", f"did not run: refused, the host disk has only {free_mb} MiB free "
                                     f"for a {disk_mb} MiB fill")
    f = shlex.quote(f"{box.paths.tmp}/.drumsbench-fill")
    body = (f"dd if=/dev/zero of={f} bs=1M count={disk_mb} 2>&1; echo \"DDRC $?\"; "
            f"echo \"SIZE $(wc -c < {f} 2>/dev/null || echo 0)\"" + ("" if keep else f"; rm -f {f}"))
    res = box.exec(_script("dd wc rm", body), timeout=timeout, env=env)
    why = _unfinished(res)
    if why:
        return _not_run("fill_disk", why)
    out = _text(res.stdout) + _text(res.stderr)
    size = re.search(r"^SIZE\s+(\d+)", out, re.M)
    rc = re.search(r"^DDRC (\d+)", out, re.M)
    if not size or not rc:
        return _not_run("fill_disk", f"did not run: no size reported: {out.strip()[-160:]}")
    written = int(size.group(1))
    if written >= disk_mb << 20:
        return ProbeResult("fill_disk", True, False, f"wrote {disk_mb} MiB with no limit")
    dd_out = out[:rc.start()].strip()
    # 153 = 128 + SIGXFSZ: dd killed at the file size limit
    sign = next((s for s in _LIMIT_SIGNS if s in dd_out), "dd exit 153 (SIGXFSZ)" if int(rc.group(1)) == 153 else "")
    if sign:
        return ProbeResult("fill_disk", True, True, f"write cut short at {written >> 20} MiB: {sign}")
    return _not_run("fill_disk", f"did not run: dd stopped at {written >> 20} MiB without hitting a limit: "
                                 f"{dd_out[-120:] or 'no message'}")


_FORK_SIGNS = ("fork", "Resource temporarily unavailable")


def _fork_bomb(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None, procs: int) -> ProbeResult:
    # Bounded: at most `procs` sleeps of 20 s, killed at the end (and by destroy if the shell died).
    # `$!` unchanged means the last fork failed (bash retries, then goes on); dash exits instead.
    body = (f'n=0; last=; pids=; while [ $n -lt {procs} ]; do sleep 20 & '
            'if [ "$!" = "$last" ]; then echo "forkfailed" >&2; break; fi; last=$!; pids="$pids $!"; '
            'n=$((n+1)); echo "STARTED $n"; done; '
            'alive=0; for p in $pids; do kill -0 $p 2>/dev/null && alive=$((alive+1)); done; '
            'echo "ALIVE $alive"; kill $pids 2>/dev/null')
    res = box.exec(_script("sleep kill", body), timeout=60, env=env)
    out, err = _text(res.stdout), _text(res.stderr)
    if re.search(rf"^{MISSING} ", out, re.M):
        return _not_run("fork_bomb", str(_unfinished(res)))
    started = len(re.findall(r"^STARTED \d+$", out, re.M))
    alive = re.search(r"^ALIVE (\d+)$", out, re.M)
    fork_failed = any(s in err for s in _FORK_SIGNS)
    if alive and int(alive.group(1)) >= procs and not _unfinished(res):
        return ProbeResult("fork_bomb", True, False, f"{procs} of {procs} processes started and alive")
    if fork_failed and started < procs:
        return ProbeResult("fork_bomb", True, True,
                           f"{started} of {procs} processes started, then a fork failed: {err.strip()[-100:]}")
    why = _unfinished(res) or (f"did not run: {alive.group(1) if alive else '?'} of {started} started processes "
                               "alive, with no fork failure")
    return _not_run("fork_bomb", why)


_HOG = """\
import sys
want, got, chunks = int(sys.argv[1]), 0, []
try:
    while got < want:
        step = min(16, want - got)
        chunks.append(bytearray(step << 20))  # zero-filled: every page is touched
        got += step
        print("GOT", got, flush=True)
except MemoryError:
    print("MEMORYERROR", got, flush=True)
    sys.exit(0)
print("HELD", got, flush=True)
"""


def _memory_hog(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None, mem_mb: int) -> ProbeResult:
    # Bounded: at most ``mem_mb`` MiB, freed when the one python3 process ends (at once).
    body = f"python3 -c {shlex.quote(_HOG)} {mem_mb}; echo \"HOGRC $?\""
    res = box.exec(_script("python3", body), timeout=120, env=env)
    why = _unfinished(res)
    out = _text(res.stdout)
    got = [int(x) for x in re.findall(r"^GOT (\d+)$", out, re.M)]
    reached = max(got, default=0)
    if re.search(rf"^HELD {mem_mb}$", out, re.M):
        return ProbeResult("memory_hog", True, False, f"held {mem_mb} MiB with no limit")
    if why:
        return _not_run("memory_hog", why)
    rc = re.search(r"^HOGRC (\d+)$", out, re.M)
    if re.search(r"^MEMORYERROR", out, re.M):
        return ProbeResult("memory_hog", True, True, f"allocation failed (MemoryError) at {reached} of {mem_mb} MiB")
    if rc and int(rc.group(1)) == 137:  # 128 + SIGKILL: the OOM killer of the sandbox's memory bound
        return ProbeResult("memory_hog", True, True, f"killed (SIGKILL, OOM) at {reached} of {mem_mb} MiB")
    return _not_run("memory_hog", f"did not run: the hog stopped at {reached} MiB without hitting a limit "
                                  f"(exit {rc.group(1) if rc else '?'}): {_text(res.stderr).strip()[-120:]}")


Probe = Callable[[Sandbox, Sandbox, "Mapping[str, str] | None"], ProbeResult]

CONTROL_VAR = "DRUMSBENCH_ESCAPE_CONTROL"


class HostControlSandbox(Sandbox, HostFolders):
    """The positive control's sandbox: a folder on the host and commands run as the harness itself.

    It isolates nothing (unlike ``process``, which may run each sandbox as its own uid), so every
    escape a probe attempts must succeed in it. Bounded by the probes themselves; its processes
    carry a label in their environment and ``destroy`` kills them and removes the folder."""

    substrate = "host-control"

    def __init__(self) -> None:
        self.run_id = "escape-control"
        self.id = secrets.token_hex(6)
        self.host_root = Path(tempfile.mkdtemp(prefix="drumsbench-control-"))
        os.chmod(self.host_root, 0o755)
        self.paths = SandboxPaths.under(str(self.host_root))
        for sub in SANDBOX_FOLDERS:
            (self.host_root / sub).mkdir()
        self._groups = ProcessGroups()
        self._destroyed = False

    def host_path(self, path: str) -> Path:
        """The control's in-sandbox paths are host paths (it isolates nothing); inside its folder only."""
        p = Path(os.path.normpath(path))
        if p != self.host_root and self.host_root not in p.parents:
            raise SubstrateError(f"{path!r} is outside the control sandbox {self.id}")
        return p

    def _run(self, req: ExecRequest) -> ExecResult:
        if self._destroyed:
            raise SubstrateError(f"control sandbox {self.id} is destroyed")
        full = {"PATH": SANDBOX_PATH, "HOME": self.paths.home, "TMPDIR": self.paths.tmp, "LANG": "C.UTF-8",
                CONTROL_VAR: self.id, **(req.env or {})}
        return self._groups.run(req.argv, req, cwd=req.cwd, env=full)

    def _host(self, path: str) -> Path:
        host = Path(os.path.normpath(path))
        if self.host_root not in host.parents:
            raise SubstrateError(f"{path!r} is outside control sandbox {self.id}")
        return host

    def write_file(self, path: str, data: bytes) -> None:
        host = self._host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data)

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        with open(self._host(path), "rb") as f:
            return f.read(-1 if limit is None else limit)

    def end_processes(self) -> None:
        """Every process its commands started: their groups, and any that left them (by label)."""
        self._groups.kill()
        kill_pids(list(pids_with_env(CONTROL_VAR, self.id)))

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._groups.kill()
        kill_pids(list(pids_with_env(CONTROL_VAR, self.id)))
        shutil.rmtree(self.host_root, ignore_errors=True)


def _run(create: Callable[[], Sandbox], disk_mb: int, procs: int, env: Mapping[str, str] | None,
         mem_mb: int = 256, only: tuple[str, ...] = PROBES) -> list[ProbeResult]:
    every: list[tuple[str, Probe]] = [
        ("write_outside", _write_outside),
        ("read_neighbour", _read_neighbour),
        ("host_loopback", _host_loopback),
        ("network", _network),
        ("fill_disk", lambda b, o, e: _fill_disk(b, o, e, disk_mb)),
        ("fork_bomb", lambda b, o, e: _fork_bomb(b, o, e, procs)),
        ("memory_hog", lambda b, o, e: _memory_hog(b, o, e, mem_mb)),
    ]
    probes = [(name, fn) for name, fn in every if name in only]
    boxes: list[Sandbox] = []
    try:
        try:
            boxes.append(create())
            boxes.append(create())
        except Exception as e:  # no sandbox, no probe: each says so
            return [_not_run(name, f"did not run: could not create a sandbox: {type(e).__name__}: {e}")
                    for name, _ in probes]
        results = []
        for name, fn in probes:
            try:
                results.append(fn(boxes[0], boxes[1], env))
            except Exception as e:  # a crash before the check is not containment
                results.append(_not_run(name, f"did not run: probe crashed: {type(e).__name__}: {e}"))
        return results
    finally:
        for box in boxes:
            with contextlib.suppress(Exception):  # the next box must still be destroyed
                box.destroy()


def run_probes(sub: Substrate, disk_mb: int = 256, procs: int = 300,
               env: Mapping[str, str] | None = None, mem_mb: int = 256) -> list[ProbeResult]:
    """Every probe once in two fresh sandboxes of ``sub`` (no control); destroys them before returning.

    ``env`` is added to every probe command's environment (a ``PATH`` without a tool shows how a
    probe that cannot run is reported)."""
    return _run(sub.create, disk_mb, procs, env, mem_mb)


def run_control(disk_mb: int = 256, procs: int = 300, env: Mapping[str, str] | None = None,
                mem_mb: int = 256) -> list[ProbeResult]:
    """The positive control: every probe in ``HostControlSandbox``es, where nothing isolates."""
    return _run(HostControlSandbox, disk_mb, procs, env, mem_mb)


def with_control(results: list[ProbeResult], control: list[ProbeResult]) -> list[ProbeResult]:
    """Attach to each probe the same probe's result where nothing isolates."""
    by_name = {c.probe: c for c in control}
    out = []
    for r in results:
        c = by_name.get(r.probe)
        if c is None:
            out.append(replace(r, control="not run", control_detail="no control result"))
        elif not c.ran:
            out.append(replace(r, control="not run", control_detail=f"control {c.detail}"))
        elif c.contained:
            out.append(replace(r, control="did not fire",
                               control_detail=f"with no isolation the probe saw no escape: {c.detail}"))
        else:
            out.append(replace(r, control="fired", control_detail=f"with no isolation: {c.detail}"))
    return out


def probe_substrate(sub: Substrate, disk_mb: int = 256, procs: int = 300, env: Mapping[str, str] | None = None,
                    control_results: list[ProbeResult] | None = None, mem_mb: int = 256) -> list[ProbeResult]:
    """Every probe on ``sub``, each with its positive control (``run_control`` with the same inputs,
    unless ``control_results`` are given: one control can serve several substrates)."""
    results = run_probes(sub, disk_mb, procs, env, mem_mb)
    if control_results is None:
        control_results = run_control(disk_mb, procs, env, mem_mb)
    return with_control(results, control_results)


# -- bounds: the resource probes against a substrate's own limits, limits on and off -------------

@dataclass(frozen=True)
class BoundResult:
    """One bound (``pids``, ``memory_mb``, ``disk_mb``) of a substrate, probed above its size."""

    bound: str
    limit: int | None  # the size probed against (None: the bound was off)
    mechanism: str  # ``Substrate.limit_mechanisms`` for it
    size: int  # what the probe tried (processes or MiB), above ``limit``
    on: ProbeResult  # limits on
    off: ProbeResult  # limits off: the positive control
    host_free_mb: tuple[int, int] | None = None  # disk: host file system free before, and while the sandbox was full

    @property
    def verdict(self) -> str:
        if self.limit is None:
            return "off"
        if not self.on.ran:
            return "did not run"
        if not self.on.contained:
            return "NOT bounded"
        if not (self.off.ran and self.off.contained is False):
            return "unconfirmed"
        if self.host_free_mb is not None and self.host_free_mb[1] < 1024:
            return "NOT bounded"  # the sandbox's "full" left the host with under 1 GiB
        return "bounded"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _host_free_mb(box: Sandbox) -> int:
    """Free MiB of the host file system under the sandbox: the one holding its host folder (the
    folder's parent: the folder itself may be the sandbox's own size-limited mount), else ``/``."""
    host_root = box.host_root if isinstance(box, HostFolders) else None
    return shutil.disk_usage(str(host_root.parent if host_root is not None else "/")).free >> 20


def _fill_and_watch(box: Sandbox, other: Sandbox, env: Mapping[str, str] | None, disk_mb: int,
                    seen: list[int]) -> ProbeResult:
    """``fill_disk`` that keeps the file until the host's free space is read (the sandbox full)."""
    seen.append(_host_free_mb(box))
    res = _fill_disk(box, other, env, disk_mb, keep=True)
    seen.append(_host_free_mb(box))
    with contextlib.suppress(Exception):
        box.exec(["rm", "-f", f"{box.paths.tmp}/.drumsbench-fill"], timeout=30)
    return res


def probe_bounds(sub: Substrate, margin: float = 1.5, env: Mapping[str, str] | None = None) -> list[BoundResult]:
    """Each bound of ``sub.limits`` that is on: its probe sized ``margin`` times the bound, in ``sub``'s
    sandboxes with the limits on and then off (the positive control); ``sub.limits`` is restored.

    The limits-off fill writes that much to the host's file system (refused, as ``fill_disk`` is,
    when the host is short): keep the bounds small here (tests use 64 MiB)."""
    from drumsbench.substrates.base import SandboxLimits

    limits = sub.limits
    mechanisms = sub.limit_mechanisms()
    out: list[BoundResult] = []
    for bound, probe in BOUND_PROBES.items():
        limit = getattr(limits, bound)
        if limit is None:
            continue
        size = int(limit * margin) + (8 if bound == "pids" else 16)
        runs: list[ProbeResult] = []
        free: list[int] = []
        for lim in (limits, SandboxLimits.off()):
            sub.limits = lim
            try:
                if bound == "disk_mb":
                    runs.append(_with_boxes(sub, _filler(env, size, free if lim is limits else [])))
                elif bound == "pids":
                    runs.append(_run(sub.create, 1, size, env, 1, only=(probe,))[0])
                else:
                    runs.append(_run(sub.create, 1, 1, env, size, only=(probe,))[0])
            finally:
                sub.limits = limits
        out.append(BoundResult(bound, limit, mechanisms.get(bound, ""), size, runs[0], runs[1],
                               (free[0], free[1]) if len(free) == 2 else None))
    return out


def _filler(env: Mapping[str, str] | None, size: int, seen: list[int]) -> Callable[[Sandbox, Sandbox], ProbeResult]:
    def fill(box: Sandbox, other: Sandbox) -> ProbeResult:
        return _fill_and_watch(box, other, env, size, seen)
    return fill


def _with_boxes(sub: Substrate, fn: Callable[[Sandbox, Sandbox], ProbeResult]) -> ProbeResult:
    """``fn`` on two fresh sandboxes of ``sub`` (destroyed after); a crash is "did not run"."""
    boxes: list[Sandbox] = []
    try:
        try:
            boxes.append(sub.create())
            boxes.append(sub.create())
        except Exception as e:
            return _not_run("fill_disk", f"did not run: could not create a sandbox: {type(e).__name__}: {e}")
        try:
            return fn(boxes[0], boxes[1])
        except Exception as e:
            return _not_run("fill_disk", f"did not run: probe crashed: {type(e).__name__}: {e}")
    finally:
        for box in boxes:
            with contextlib.suppress(Exception):
                box.destroy()
