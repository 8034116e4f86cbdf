"""Samples what the harness holds through a window, for the leak check (``measure/leaks.py``).

Every sample (a background thread, every hundredth of the planned length, between 0.25 s and 15 s)
reads, from ``/proc`` and the file system:

- ``fds``: open file descriptors of the harness process (``/proc/<pid>/fd``);
- ``processes`` / ``zombies``: the harness's descendants (parent links of ``/proc/*/stat``), and
  those of them in state Z;
- ``mounts``: lines of the harness's ``/proc/self/mountinfo`` that name the run (``run_id`` in the
  mount point or source: every folder a run mounts on the host is under its own run folder); all its
  lines when no run id is given. On a shared host other users mount and unmount all the time (a
  30-minute desktop soak saw the host's table grow by 15 while other engineers' tests ran), and
  what is not the run's is not its leak;
- ``tmp_entries`` / ``shm_entries``: entries under the host's ``/tmp`` (with every other shared place
  a sandbox uid can write: ``/var/tmp``, ``/run/lock``, ..., ``host_places.shared_places``) and under
  ``/dev/shm``, recursively, each on its own file system, counted up to ``ENTRY_CAP`` (a note says
  when the cap was hit);
- ``store_mib``: disk use (allocated blocks) of the sandbox store, ``state.state_dir()``;
- ``daemon_mib``: on docker, the RSS of ``dockerd``; on podman, the summed RSS of its ``conmon``
  processes (podman has no daemon; conmon watches each container).

A sample that cannot read something records None for it; the sampler never breaks a window.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from drumsbench.core import host_state as state
from drumsbench.core.host_places import shared_places
from drumsbench.measure.artifacts import LeakSamplesArtifact
from drumsbench.measure.leaks import QUANTITIES

ENTRY_CAP = 100_000
HOST_TMP, HOST_SHM = "/tmp", "/dev/shm"  # module-level so a test can point them at folders of its own
DAEMONS = {"docker": ("dockerd",), "podman": ("conmon",)}


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, comm) of every process."""
    out: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        head, _, rest = raw.rpartition(")")
        fields = rest.split()
        if len(fields) < 2:
            continue
        out[int(entry)] = (int(fields[1]), fields[0], head.partition("(")[2])
    return out


def _descendants(procs: dict[int, tuple[int, str, str]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return 0.0  # a kernel thread or a zombie: no resident memory


def _walk(root: str, cap: int, blocks: bool = False) -> tuple[float | None, bool]:
    """(entries below ``root`` — or their allocated MiB with ``blocks`` —, whether the cap was hit),
    staying on ``root``'s file system and never following symlinks."""
    try:
        dev = os.lstat(root).st_dev
    except OSError:
        return None, False
    count, total, todo = 0, 0, [root]
    while todo:
        folder = todo.pop()
        try:
            with os.scandir(folder) as it:
                for e in it:
                    count += 1
                    if count > cap:
                        return (total / 2**20 if blocks else float(cap)), True
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if blocks:
                        total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False) and st.st_dev == dev:
                        todo.append(e.path)
        except OSError:
            continue
    return (total / 2**20 if blocks else float(count)), False


class LeakSampler:
    """Samples ``QUANTITIES`` for the harness process ``pid`` (this one by default) in a thread;
    ``stop()`` returns the window's ``LeakSamplesArtifact``."""

    def __init__(self, substrate: str, planned_s: float | None = None, interval_s: float | None = None,
                 pid: int | None = None, tmp: str | None = None, shm: str | None = None,
                 store: Path | None = None, run_id: str | None = None) -> None:
        self.substrate = substrate
        self.run_mark = run_id.encode() if run_id else None
        self.pid = pid or os.getpid()
        self.tmp, self.shm = tmp or HOST_TMP, shm or HOST_SHM
        # tmp_entries: /tmp and the host's other shared places (each once: none inside another)
        places = [self.tmp] if self.tmp != "/tmp" else [p for p in shared_places() if p != self.shm] + [self.tmp]
        self.tmp_roots = sorted({p for p in places
                                 if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in places)})
        self.store = store if store is not None else state.state_dir()
        self.daemons = DAEMONS.get(substrate, ())
        self.columns = ["t"] + [q.key for q in QUANTITIES if q.key != "daemon_mib" or self.daemons]
        self.interval_s = interval_s or min(15.0, max(0.25, (planned_s or 25.0) / 100))
        self.rows: list[list[float | None]] = []
        self.notes: set[str] = set()
        self._cost: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drumsbench-leaks", daemon=True)
        self.before: dict[str, float | None] = {}

    def sample(self) -> dict[str, float | None]:
        """One reading of every quantity (None where it could not be read)."""
        t0 = time.perf_counter()
        v: dict[str, float | None] = {}
        try:
            v["fds"] = float(len(os.listdir(f"/proc/{self.pid}/fd")))
        except OSError:
            v["fds"] = None
        try:
            procs = _procs()
            under = _descendants(procs, self.pid)
            v["processes"] = float(len(under))
            v["zombies"] = float(sum(1 for p in under if procs[p][1] == "Z"))
        except OSError:
            v["processes"] = v["zombies"] = None
            procs = {}
        try:
            with open(f"/proc/{self.pid}/mountinfo", "rb") as f:
                v["mounts"] = float(sum(1 for line in f if self.run_mark is None or self.run_mark in line))
        except OSError:
            v["mounts"] = None
        for key, roots in (("tmp_entries", self.tmp_roots), ("shm_entries", [self.shm])):
            counts = [_walk(root, ENTRY_CAP) for root in roots]
            seen = [c for c, _ in counts if c is not None]
            v[key] = sum(seen) if seen else None
            if any(capped for _, capped in counts):
                self.notes.add(f"{key}: counting stopped at {ENTRY_CAP} entries")
        v["store_mib"], capped = _walk(str(self.store), 10 * ENTRY_CAP, blocks=True)
        if capped:
            self.notes.add(f"store_mib: stopped at {10 * ENTRY_CAP} entries (a lower bound)")
        if self.daemons:
            found = [p for p, (_, st, comm) in procs.items() if comm in self.daemons and st != "Z"]
            rss = [r for p in found if (r := _rss_mib(p)) is not None]
            v["daemon_mib"] = sum(rss) if rss else None
            if not found:
                self.notes.add(f"daemon_mib: no {'/'.join(self.daemons)} process seen")
        self._cost.append(time.perf_counter() - t0)
        return v

    def _row(self) -> None:
        t = time.time()
        v = self.sample()
        row: list[float | None] = [round(t, 3)]
        self.rows.append(row + [v.get(k) for k in self.columns[1:]])

    def start(self) -> LeakSampler:
        self.before = self.sample()
        self._row()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._row()
            except Exception as e:  # a sampler must never break a window
                self.notes.add(f"a sample failed: {type(e).__name__}: {e}"[:200])

    def stop(self) -> LeakSamplesArtifact:
        """Stop sampling and read everything once more (after the window's teardown)."""
        self._stop.set()
        self._thread.join(timeout=30)
        after = self.sample()
        keys = self.columns[1:]
        return LeakSamplesArtifact(
            substrate=self.substrate, interval_s=self.interval_s, columns=self.columns, rows=self.rows,
            before={k: self.before.get(k) for k in keys}, after={k: after.get(k) for k in keys},
            sample_ms=round(1000 * sum(self._cost) / len(self._cost), 3) if self._cost else None,
            notes=sorted(self.notes), mounts_of_run=self.run_mark.decode() if self.run_mark else None)
