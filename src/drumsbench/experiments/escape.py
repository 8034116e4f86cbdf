"""Escape attempts: what a substrate really contains, probed from inside real sandboxes.

Each probe runs commands in a sandbox as a task would and checks the effect from the host:

| probe | done inside the sandbox | contained when |
|---|---|---|
| write_outside | write a token into the host's /tmp and beside the sandbox folder | no token file appears on the host |
| read_neighbour | read another live sandbox's secret file (in-sandbox and host paths) | the secret is not printed |
| host_loopback | connect to a TCP port the host listens on at 127.0.0.1 | the host accepts no connection |
| network | look for any non-loopback interface | only `lo` exists |
| fill_disk | write up to ``disk_mb`` MiB into the sandbox's tmp | the write is cut short by a limit |
| fork_bomb | start up to ``procs`` sleeping processes | a process limit stops it before that |

The report states per substrate what was contained; ``process`` is reported as what it is: no
isolation.
"""

from __future__ import annotations

import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from drumsbench.substrates.base import Sandbox, Substrate


@dataclass(frozen=True)
class ProbeResult:
    probe: str
    contained: bool
    detail: str


def _write_outside(box: Sandbox, other: Sandbox) -> ProbeResult:
    token = f"escape-{secrets.token_hex(6)}"
    targets = [f"/tmp/drumsbench-{token}", f"{box.paths.root}/../drumsbench-{token}"]
    box.exec("; ".join(f"echo x > {t} 2>/dev/null" for t in targets), timeout=20)
    host_root = getattr(box, "host_root", None)
    found = [p for p in (Path(f"/tmp/drumsbench-{token}"),
                         Path(str(host_root)).parent / f"drumsbench-{token}" if host_root else None)
             if p is not None and p.exists()]
    for p in found:
        p.unlink()
    return ProbeResult("write_outside", not found, f"host files written: {[str(p) for p in found] or 'none'}")


def _read_neighbour(box: Sandbox, other: Sandbox) -> ProbeResult:
    secret = f"SECRET-{secrets.token_hex(8)}"
    other.write_file(f"{other.paths.work}/secret.txt", secret.encode())
    paths = [f"{other.paths.work}/secret.txt"]
    host_root = getattr(other, "host_root", None)
    if host_root is not None:
        paths.append(f"{host_root}/work/secret.txt")
    res = box.exec("; ".join(f"cat {p} 2>/dev/null" for p in paths), timeout=20)
    leaked = secret.encode() in res.stdout
    return ProbeResult("read_neighbour", not leaked, "neighbour's secret read" if leaked else "neighbour unreadable")


def _host_loopback(box: Sandbox, other: Sandbox) -> ProbeResult:
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
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2).close()"
    box.exec(["python3", "-c", code], timeout=20)
    stop.set()
    t.join()
    srv.close()
    return ProbeResult("host_loopback", not accepted,
                       f"host port 127.0.0.1:{port} accepted {len(accepted)} connection(s) from the sandbox")


def _network(box: Sandbox, other: Sandbox) -> ProbeResult:
    res = box.exec("cat /proc/net/dev", timeout=20)
    names = [ln.split(":")[0].strip() for ln in res.stdout.decode(errors="replace").splitlines()[2:] if ":" in ln]
    others = [n for n in names if n != "lo"]
    return ProbeResult("network", not others, f"interfaces: {', '.join(names) or 'none'}")


def _fill_disk(box: Sandbox, other: Sandbox, disk_mb: int) -> ProbeResult:
    res = box.exec(f"dd if=/dev/zero of={box.paths.tmp}/fill bs=1M count={disk_mb} 2>&1; rm -f {box.paths.tmp}/fill",
                   timeout=120)
    out = res.stdout.decode(errors="replace")
    complete = f"{disk_mb}+0 records out" in out
    return ProbeResult("fill_disk", not complete,
                       f"wrote {disk_mb} MiB with no limit" if complete else f"write cut short: {out.strip()[-120:]}")


def _fork_bomb(box: Sandbox, other: Sandbox, procs: int) -> ProbeResult:
    # Count the jobs this shell really has: on a failed fork the loop stops (or the shell dies).
    script = (f"n=0; while [ $n -lt {procs} ]; do sleep 30 & n=$((n+1)); done; "
              'jobs -p > "$TMPDIR/jobs"; wc -l < "$TMPDIR/jobs"; kill $(cat "$TMPDIR/jobs") 2>/dev/null; true')
    res = box.exec(script, timeout=120)
    try:
        started = int(res.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        started = 0
    contained = started < procs
    return ProbeResult("fork_bomb", contained, f"{started} of {procs} processes started")


def probe_substrate(sub: Substrate, disk_mb: int = 256, procs: int = 300) -> list[ProbeResult]:
    """Run every probe in fresh sandboxes of ``sub``; destroys them all before returning."""
    box, other = sub.create(), sub.create()
    try:
        return [
            _write_outside(box, other),
            _read_neighbour(box, other),
            _host_loopback(box, other),
            _network(box, other),
            _fill_disk(box, other, disk_mb),
            _fork_bomb(box, other, procs),
        ]
    finally:
        box.destroy()
        other.destroy()
