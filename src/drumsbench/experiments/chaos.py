"""``drumsbench chaos``: a ``run`` under events injected from outside the harness (docs/chaos.md).

The driver runs the harness as a child process (``drumsbench run ...``, then ``run --resume RUN``
after each stop) and, at seeded random moments, injects one of:

- ``harness_kill``: SIGKILL of the harness, ``drumsbench gc``, then ``run --resume``;
- ``sandbox_kill``: SIGKILL of one process of the run's sandboxes (host-process substrates);
- ``container_kill``: ``docker kill`` of one of the run's containers (docker), SIGKILL of one of
  their conmon processes (podman) — never dockerd or podman's service;
- ``desktop_kill``: SIGKILL of one of the run's ``soffice.bin`` or ``Xvfb`` (desktop tasks);
- ``vm_kill``: SIGKILL of one of the run's QEMU processes (vm), a busy one (``busiest``);
- ``daemon_kill``: SIGKILL of dockerd, then dockerd started again with the same command line (docker;
  opt-in only: it stops every user's containers on the machine);
- ``ledger_reader``: a second process holds a read transaction on the ledger for some seconds;
- ``disk_full``: the out folder (a small tmpfs the driver mounts) is filled from outside for some
  seconds, then freed; a harness that stopped is resumed.

Each event is a ``chaos-event`` artifact in the run's ledger. At the end ``gc`` runs and the checks
of ``measure.chaos`` plus ``gc_clean`` (no sandbox folder, container, process or new /tmp entry of
the run) and ``harness`` (no exit the driver did not cause) give the verdict.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from drumsbench.core import host_state as state
from drumsbench.core.errors import UsageError
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.artifacts import ChaosCheck, ChaosEventArtifact, ChaosSummaryArtifact
from drumsbench.measure.chaos import digest, judge

KINDS = ("harness_kill", "sandbox_kill", "container_kill", "desktop_kill", "vm_kill", "daemon_kill", "ledger_reader",
         "disk_full")
OPT_IN = ("daemon_kill",)  # never in the default set: it hits everyone on the machine, not only this run
HOST_PROCESS = ("process", "bwrap", "overlay")
RUN_VAR = "DRUMSBENCH_RUN"
DESKTOP_PROCS = ("soffice.bin", "Xvfb")
QEMU_PREFIX = "qemu-system"
DOCKERD_LOG = Path(os.environ.get("DRUMSBENCH_DOCKERD_LOG", "/var/log/drumsbench-dockerd.log"))
DOCKERD_WAIT_S = 120.0
# what a run of ours may leave in the host's /tmp (anything else new there is another user's)
TMP_OURS: tuple[str, ...] = ("drumsbench",)
TMP_DESKTOP = ("OSL_PIPE_",)  # LibreOffice's pipes: counted only for desktop runs (others' are not ours)
PROGRESS_WAIT_S = 120.0  # after a resume, the next event waits for an attempt at most this long
FULL_GRACE_S = 180.0  # after a full disk is freed: how long to wait for the harness to show it ran on or stopped
TMP_RECHECK_S = 10.0  # a new /tmp entry counts as left behind only if it is still there this much later


class ChaosConfig(BaseModel):
    substrate: str = "process"
    tasks: str = "coding"
    policy: str = "oracle"
    concurrency: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=512)
    duration_s: float = Field(60.0, gt=0)  # of the run (time the harness was alive)
    every_s: float = Field(10.0, gt=0)  # mean time between events
    seed: int = 0
    kinds: list[str] = Field(default_factory=list)  # empty: every kind that applies
    hold_s: float = Field(3.0, gt=0)  # ledger_reader and disk_full
    tmpfs_mib: int | None = Field(None, ge=8)  # the out folder on a tmpfs of this size (disk_full needs it)
    step_timeout_s: float = Field(30.0, gt=0)
    episode_timeout_s: float = Field(300.0, gt=0)


def applicable(substrate: str, tasks: str, tmpfs: bool) -> list[str]:
    """The kinds of event that apply to this substrate and suite by default (``OPT_IN`` kinds are
    never among them; ``--events`` names them)."""
    out = ["harness_kill", "ledger_reader"]
    if substrate in HOST_PROCESS:
        out.append("sandbox_kill")
    if substrate in ("docker", "podman"):
        out.append("container_kill")
    if substrate == "vm":
        out.append("vm_kill")
    if tasks == "desktop":
        out.append("desktop_kill")
    if tmpfs:
        out.append("disk_full")
    return out


def pids_of_run(run_id: str) -> dict[int, str]:
    """Host processes whose environment carries ``DRUMSBENCH_RUN=run_id``: pid -> command name."""
    needle = f"{RUN_VAR}={run_id}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            found[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
    return found


def busiest(pids: dict[int, str], rng: random.Random, window_s: float = 0.3) -> tuple[int, str]:
    """The pid to kill among ``pids``: one of those that used the most CPU over ``window_s`` (at least
    half the top figure), and a note of the CPU seconds each used. A VM serving an attempt runs its
    commands and tests (under TCG a busy guest keeps a core near 100 %); a pool's idle spare halts.
    The harness is another process, so which sandbox a slot holds is not known here (for docker
    ``ExecIDs`` says it; a VM's exec goes over a socketpair only the harness holds)."""
    def cpu(pid: int) -> float | None:
        try:  # utime and stime: fields 14 and 15 of stat, counted after the command name's ')'
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = {p: cpu(p) for p in pids}
    time.sleep(window_s)
    used = {p: (c1 - c0) for p in pids if (c0 := before[p]) is not None and (c1 := cpu(p)) is not None}
    if not used:
        return rng.choice(sorted(pids)), " (every candidate had ended)"
    top = max(used.values())
    pid = rng.choice(sorted(p for p, u in used.items() if u >= top / 2))
    figures = ", ".join(f"{p}: {u:.2f}" for p, u in sorted(used.items()))
    return pid, f" (CPU-s over {window_s:g} s: {figures})"


def engine_cli(engine: str, args: list[str]) -> str:
    """stdout of ``docker ARGS`` or of ``podman ARGS`` with the podman substrate's private configuration
    (its storage is not the machine's default: a plain ``podman ps`` sees none of its containers)."""
    if engine == "podman":
        from drumsbench.substrates.containers.podman_cli import podman

        return podman(args, check=False, timeout=60).stdout.decode(errors="replace")
    return subprocess.run([engine, *args], capture_output=True, text=True, timeout=60).stdout


def containers_of_run(engine: str, run_id: str, running_only: bool = False) -> list[str]:
    if shutil.which(engine) is None:
        return []
    return engine_cli(engine, ["ps", "-q" if running_only else "-aq", "--filter",
                               f"label=drumsbench.run={run_id}"]).split()


def listening(path: str) -> bool:
    """Is ``path`` a Unix socket something still listens on (a live process's, e.g. another user's
    running LibreOffice)? A socket left behind by a dead process refuses the connection."""
    import socket
    import stat

    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def tmp_entries() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/tmp"))
    return set()


class Chaos:
    """One chaos run: ``out`` keeps the ledger (copied there from the tmpfs at the end when one is
    used) and the harness's logs."""

    def __init__(self, cfg: ChaosConfig, out: Path, say: Callable[[str], None]) -> None:
        self.cfg, self.out, self.say = cfg, out, say
        self.kinds = cfg.kinds or applicable(cfg.substrate, cfg.tasks, cfg.tmpfs_mib is not None)
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise UsageError(f"--events: {unknown[0]!r} is not one of {', '.join(KINDS)}")
        if "vm_kill" in self.kinds and cfg.substrate != "vm":
            raise UsageError("--events vm_kill: only with --substrate vm")
        if "daemon_kill" in self.kinds and cfg.substrate != "docker":
            raise UsageError("--events daemon_kill: only with --substrate docker (podman has no daemon; its "
                             "conmon is killed by container_kill)")
        if "disk_full" in self.kinds and cfg.tmpfs_mib is None:
            raise UsageError("--events disk_full: give --tmpfs-mib N; the out folder is filled only on a tmpfs of "
                             "its own")
        self.live = out / "live" if cfg.tmpfs_mib else out
        self.rng = random.Random(f"chaos:{cfg.seed}")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.unexpected: list[str] = []
        self.run_id: str | None = None
        self.events: list[ChaosEventArtifact] = []
        self.mounted = False
        self.done = False  # the run was complete when an event stopped the harness: nothing to resume
        self.resumed_at: float | None = None  # a resumed harness has not yet recorded an attempt
        self.resumed_with = 0

    # -- the harness -------------------------------------------------------------------------------
    def _harness_args(self) -> list[str]:
        c = self.cfg
        if self.run_id is not None:
            return ["run", "--resume", self.run_id, "--out", str(self.live), "--no-progress"]
        return ["run", "--substrate", c.substrate, "--tasks", c.tasks, "--policy", c.policy,
                "--concurrency", str(c.concurrency), "--duration", f"{c.duration_s:g}s", "--seed", str(c.seed),
                "--step-timeout", f"{c.step_timeout_s:g}s", "--episode-timeout", f"{c.episode_timeout_s:g}s",
                "--out", str(self.live), "--no-progress"]

    def _start(self) -> None:
        logs = self.out / "chaos-logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"harness-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "drumsbench", *self._harness_args()], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.starts += 1

    def _log_tail(self) -> str:
        path = self.out / "chaos-logs" / f"harness-{self.starts - 1}.log"
        with contextlib.suppress(OSError):
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
            return lines[-1][:200] if lines else ""
        return ""

    def _gc(self) -> str:
        proc = subprocess.run([sys.executable, "-m", "drumsbench", "gc"], capture_output=True, text=True, timeout=300)
        return (proc.stdout.strip().splitlines() or ["gc: no output"])[0]

    def _find_run(self) -> None:
        if self.run_id is not None:
            return
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{self.live / 'ledger.sqlite'}?mode=ro", uri=True, timeout=5)
            try:
                row = db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 1").fetchone()
            finally:
                db.close()
            if row:
                self.run_id = row[0]

    def _ledger(self) -> Ledger:
        return Ledger(self.live / "ledger.sqlite")

    # -- the run -----------------------------------------------------------------------------------
    def execute(self) -> tuple[str, ChaosSummaryArtifact]:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.cfg.tmpfs_mib:
            if (self.out / "ledger.sqlite").exists():
                raise UsageError(f"--tmpfs-mib: {self.out} already has a ledger; give a new --out")
            self.live.mkdir(parents=True, exist_ok=True)
            mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.cfg.tmpfs_mib}m", "tmpfs",
                                    str(self.live)], capture_output=True, text=True)
            if mount.returncode != 0:
                raise UsageError(f"--tmpfs-mib: cannot mount a tmpfs at {self.live}: {mount.stderr.strip()}")
            self.mounted = True
        tmp_before = tmp_entries()
        try:
            self._drive()
            run_id = self.run_id
            if run_id is None:
                raise UsageError(f"chaos: the harness recorded no run; see {self.out / 'chaos-logs'}")
            self.say(f"run {self._status() or 'unknown'}; gc")
            gc_line = self._gc()
            clean = self._clean(run_id, tmp_before, gc_line)
        finally:
            with contextlib.suppress(Exception):
                self._stop_harness()
            if self.mounted:
                self._copy_out()
        ledger = Ledger(self.out / "ledger.sqlite")
        try:
            checks = judge(ledger, run_id)
            checks["gc_clean"] = clean
            checks["harness"] = ChaosCheck(passed=not self.unexpected, detail="; ".join(self.unexpected[:3]) or
                                           f"{self.starts} start(s), every stop caused by an event; run complete")
            summary = ChaosSummaryArtifact(
                events=len(self.events), by_kind=dict(Counter(e.kind for e in self.events)),
                attempts=ledger.count(run_id), harness_starts=self.starts, checks=checks,
                passed=all(c.passed for c in checks.values()))
            artifacts.put(ledger, run_id, "summary", summary)
        finally:
            ledger.close()
        return run_id, summary

    def _drive(self) -> None:
        self._start()
        start = time.monotonic()
        next_at = start + self._gap()
        while True:
            assert self.proc is not None
            if self.done:
                return
            rc = self.proc.poll()
            if rc is not None:
                self._find_run()
                if self._status() == "complete":
                    if rc != 0:  # it crashed after its last attempt (e.g. in its report)
                        self.unexpected.append(f"harness start {self.starts - 1} exited {rc} after the run was "
                                               f"complete: {self._log_tail()}")
                    return
                self.unexpected.append(f"harness start {self.starts - 1} exited {rc} on its own: {self._log_tail()}")
                if len(self.unexpected) > 3 or self.run_id is None:
                    self.say(f"giving up: the harness exited on its own {len(self.unexpected)} times")
                    return
                self.say(f"harness exited {rc} on its own; resuming")
                self._gc()
                self._start()
                continue
            self._find_run()
            if self.run_id is not None and time.monotonic() >= next_at and self._working():
                self._inject(self.rng.choice(self.kinds))
                next_at = time.monotonic() + self._gap()
            time.sleep(0.1)

    def _working(self) -> bool:
        """May the next event come? Not before a resumed harness recorded an attempt (or ``PROGRESS_WAIT_S``
        passed): events faster than a start under load would stop it before it does any work, and a chaos
        run that never lets the harness work proves nothing (nor ever ends)."""
        if self.resumed_at is None:
            return True
        if self._count_ro() > self.resumed_with or time.monotonic() - self.resumed_at > PROGRESS_WAIT_S:
            self.resumed_at = None
            return True
        return False

    def _gap(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.cfg.every_s

    def _read_one(self, sql: str) -> tuple[object, ...] | None:
        """One row of ``sql`` (with the run id as its parameter) through a read-only connection: the
        driver never writes the ledger, and reads it even when its disk is full. None when unreadable."""
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{self.live / 'ledger.sqlite'}?mode=ro", uri=True, timeout=30)
            try:
                row: tuple[object, ...] | None = db.execute(sql, (self.run_id,)).fetchone()
                return row
            finally:
                db.close()
        return None

    def _count_ro(self) -> int:
        """Attempts recorded for the run (0 when unreadable)."""
        row = self._read_one("SELECT COUNT(*) FROM attempts WHERE run_id = ?")
        return int(str(row[0])) if row else 0

    def _status(self) -> str | None:
        row = self._read_one("SELECT status FROM runs WHERE run_id = ?")
        return str(row[0]) if row else None

    def _stop_harness(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- events ------------------------------------------------------------------------------------
    def _inject(self, kind: str) -> None:
        assert self.run_id is not None and self.proc is not None
        run_id, index = self.run_id, len(self.events)
        segment = self.starts - 1
        t = time.time()
        acted: float | None = None  # the kill's own moment, returned by _act() at its signal or command
        hold_s: float | None = None
        exit_code: int | None = None
        integrity: str | None = None
        stopped_t: float | None = None
        if kind == "harness_kill":
            target = f"harness pid {self.proc.pid}"
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            t = stopped_t = time.time()
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            followed = f"{before.n} recorded when it died; {self._gc()}; {self._resume()}"
        elif kind in ("sandbox_kill", "desktop_kill", "vm_kill"):
            pids = self._pick_pids(kind)
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            if not pids:
                target, followed = "none", "no process of the run's sandboxes was running"
            else:
                busy = ""
                if kind == "vm_kill":  # a pool's idle spare is a QEMU too: a kill of it hits no attempt
                    pid, busy = busiest(pids, self.rng)
                    comm = pids[pid]
                else:
                    pid, comm = self.rng.choice(sorted(pids.items()))
                acted = self._act()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                target, followed = f"pid {pid} ({comm})", f"killed{busy}; the harness goes on"
        elif kind == "container_kill":
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            target, followed, acted = self._kill_container(run_id)
        elif kind == "daemon_kill":
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            target, followed, acted = self._kill_dockerd()
        elif kind == "ledger_reader":
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            target, followed = self._hold_reader(run_id, before.n)
            hold_s = self.cfg.hold_s
        elif kind == "disk_full":
            with contextlib.closing(self._ledger()) as ledger:
                before = digest(ledger, run_id)
            target, exit_code, integrity = self._fill_disk()
            hold_s = self.cfg.hold_s
            if exit_code is None:
                followed = f"full {hold_s:g} s; the harness ran on"
            else:
                stopped_t = time.time()
                with contextlib.closing(self._ledger()) as ledger:  # the rows when it died, as for a kill
                    before = digest(ledger, run_id)
                tail, gc_line = self._log_tail(), self._gc()
                followed = f"the harness stopped (exit {exit_code}: {tail}); {gc_line}; {self._resume()}"
        else:
            raise UsageError(f"--events: {kind!r} is not one of {', '.join(KINDS)}")
        if acted is not None:  # the kill's own moment, after the choosing (busiest samples 0.3 s)
            t = acted
        with contextlib.closing(self._ledger()) as ledger:
            after = ledger.count(run_id)
            ev = ChaosEventArtifact(index=index, t=t, kind=kind, target=target, harness_segment=segment,
                                    before=before, attempts_after=after, hold_s=hold_s, followed=followed,
                                    harness_exit=exit_code, integrity=integrity,
                                    stopped_t=stopped_t)
            artifacts.put(ledger, run_id, f"event-{index:04d}", ev)
        self.events.append(ev)
        self.say(f"event {index} {kind} -> {target}: {followed}")

    @staticmethod
    def _act() -> float:
        """Now, the event's moment (``ChaosEventArtifact.t``): called just before the signal or the
        command that injects it, and returned by the kill to ``_inject``. The ``classified`` gate
        takes the attempts in flight at ``t`` as the event's, so a ``t`` taken before choosing a
        target (a QEMU's CPU sampled over 0.3 s, an engine asked which container is busy) points at
        attempts the kill never touched."""
        return time.time()

    def _resume(self) -> str:
        """After the driver stopped the harness: ``run --resume``, unless the run had already ended."""
        if self._status() == "complete":
            self.done = True
            return "the run was already complete: not resumed"
        self.resumed_at, self.resumed_with = time.monotonic(), self._count_ro()
        self._start()
        return f"resumed (start {self.starts - 1})"

    def _pick_pids(self, kind: str) -> dict[int, str]:
        assert self.run_id is not None
        deadline = time.monotonic() + 3
        while True:
            pids = {p: c for p, c in pids_of_run(self.run_id).items() if self.proc is None or p != self.proc.pid}
            if kind == "desktop_kill":
                pids = {p: c for p, c in pids.items() if c in DESKTOP_PROCS}
            elif kind == "vm_kill":
                pids = {p: c for p, c in pids.items() if c.startswith(QEMU_PREFIX)}
            if pids or time.monotonic() > deadline:
                return pids
            time.sleep(0.05)

    def _kill_container(self, run_id: str) -> tuple[str, str, float | None]:
        """(target, what followed, the kill's moment from ``_act``: None when nothing was killed)."""
        engine = self.cfg.substrate
        running = containers_of_run(engine, run_id, running_only=True)
        if not running:
            return "none", "no container of the run was running", None
        if engine == "docker":
            # a container with an exec running serves an attempt now; an idle one (a pool's spare, one
            # being removed) is killed only when none is busy: a kill that hits no attempt tests nothing
            execs = (line.partition(" ") for line in
                     engine_cli("docker", ["inspect", "--format", "{{.Id}} {{len .ExecIDs}}", *running]).splitlines())
            busy = [full for full, _, n in execs if n.strip() not in ("", "0")]
            cid = self.rng.choice(sorted(c for c in running if any(b.startswith(c) for b in busy)) or sorted(running))
            acted = self._act()
            proc = subprocess.run(["docker", "kill", cid], capture_output=True, text=True, timeout=60)
            followed = ("docker kill: " + (proc.stderr.strip() or "killed")
                        + ("" if busy else " (no container had an exec running)"))[:200]
            return f"container {cid[:12]}", followed, acted
        cid = self.rng.choice(sorted(running))
        conmon = engine_cli("podman", ["inspect", "--format", "{{.State.ConmonPid}}", cid]).strip()
        if not conmon.isdigit() or int(conmon) <= 1:
            return f"container {cid[:12]}", "no conmon found", None
        acted = self._act()
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(conmon), signal.SIGKILL)
        return f"conmon pid {conmon} of container {cid[:12]}", "conmon killed", acted

    def _kill_dockerd(self) -> tuple[str, str, float | None]:
        """SIGKILL of dockerd, then the same command line started again with the same environment and
        working folder (detached, its log appended to ``DOCKERD_LOG``: not the chaos run's, whose
        temp folders go away) and waited for until ``docker info`` answers. (target, what followed,
        the kill's moment from ``_act``: None when nothing was killed)."""
        pids = [int(p) for p in subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True,
                                               timeout=30).stdout.split()]
        if not pids:
            return "none", "no dockerd was running", None
        pid = pids[0]
        try:  # its command line, environment and working folder: it is started again exactly so
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            environ = dict(item.decode(errors="replace").partition("=")[::2]
                           for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item)
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return f"dockerd pid {pid}", "gone before it could be read", None
        acted = self._act()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
        with DOCKERD_LOG.open("ab") as log:
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=environ, cwd=cwd if os.path.isdir(cwd) else "/")
        while time.monotonic() - t0 < DOCKERD_WAIT_S:
            if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0:
                return (f"dockerd pid {pid}", f"killed; `{' '.join(argv)}` answered again after "
                        f"{time.monotonic() - t0:.1f} s", acted)
            time.sleep(0.5)
        self.unexpected.append(f"dockerd did not answer within {DOCKERD_WAIT_S:g} s of its restart "
                               f"(log: {DOCKERD_LOG})")
        return f"dockerd pid {pid}", f"killed; restarted but not answering after {DOCKERD_WAIT_S:g} s", acted

    def _hold_reader(self, run_id: str, n_before: int) -> tuple[str, str]:
        hold = self.cfg.hold_s
        code = ("import sqlite3, sys, time\n"
                "db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\n"
                "db.execute('BEGIN'); n = db.execute('SELECT COUNT(*) FROM attempts').fetchone()[0]\n"
                "print(n, flush=True); time.sleep(float(sys.argv[2])); db.execute('COMMIT')\n")
        reader = subprocess.Popen([sys.executable, "-c", code, str(self.live / "ledger.sqlite"), str(hold)],
                                  stdout=subprocess.PIPE, text=True)
        out, _ = reader.communicate(timeout=hold + 60)
        with contextlib.closing(self._ledger()) as ledger:
            n_after = ledger.count(run_id)
        return (f"reader pid {reader.pid}",
                f"held a read transaction {hold:g} s (saw {out.strip()}); {n_after - n_before} attempts recorded "
                f"meanwhile")

    def _fill_disk(self) -> tuple[str, int | None, str]:
        """Fill the out folder, hold it full (or until the harness exits), free it: (target, the
        harness's exit code or None, the ledger's integrity check)."""
        assert self.proc is not None
        filler = self.live / ".chaos-fill"
        chunk = b"\0" * (1 << 20)
        written = 0
        with filler.open("wb", buffering=0) as f:
            for size in (1 << 20, 4096, 1):
                try:
                    while True:
                        written += f.write(chunk[:size])
                except OSError:
                    continue
        deadline = time.monotonic() + self.cfg.hold_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        n_full = self._count_ro()  # the disk is still full: read only (opening a Ledger writes)
        filler.unlink()
        rc = self._stopped_by_full_disk(n_full)
        with contextlib.closing(self._ledger()) as ledger:
            integrity = str(ledger.db.execute("PRAGMA integrity_check").fetchone()[0])
        return f"{self.live} ({written >> 20} MiB filled)", rc, integrity

    def _stopped_by_full_disk(self, n_full: int) -> int | None:
        """After the disk was freed: did the full disk stop the harness? A refused write stops the job
        at once, but the harness exits only after its teardown (seconds, more under load), so a harness
        still alive when the disk is freed may be on its way out. It ran on once an attempt is recorded
        after the free (a stopped job records nothing more); it was stopped when it exits first.
        Returns its exit code when stopped, else None (no answer within ``FULL_GRACE_S``: ran on)."""
        assert self.proc is not None
        deadline = time.monotonic() + FULL_GRACE_S
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:  # complete and 0: it finished; else the full disk stopped it (or its report)
                return None if rc == 0 and self._status() == "complete" else rc
            if self.run_id is None or self._count_ro() > n_full:
                return None
            time.sleep(0.25)
        return None

    # -- the end -----------------------------------------------------------------------------------
    def _clean(self, run_id: str, tmp_before: set[str], gc_line: str) -> ChaosCheck:
        from drumsbench.substrates import registry

        left: list[str] = []
        with contextlib.suppress(Exception):
            left += registry.get(self.cfg.substrate)(run_id, state.state_dir()).leftovers()
        left += [f"process {p} ({c})" for p, c in pids_of_run(run_id).items()]
        for engine in ("docker", "podman"):
            if self.cfg.substrate == engine:
                left += [f"{engine} container {c}" for c in containers_of_run(engine, run_id)]
        ours = TMP_OURS + (TMP_DESKTOP if self.cfg.tasks == "desktop" else ())
        new_tmp = sorted(e for e in tmp_entries() - tmp_before if e.startswith(ours))
        if new_tmp:  # another user's live run makes and removes such entries too: what we left stays
            time.sleep(TMP_RECHECK_S)
            new_tmp = sorted(e for e in set(new_tmp) & tmp_entries() if not listening(f"/tmp/{e}"))
        left += [f"/tmp/{e}" for e in new_tmp]
        if (self.live / ".chaos-fill").exists():
            left.append(str(self.live / ".chaos-fill"))
        return ChaosCheck(passed=not left, detail="; ".join(left[:5]) or f"nothing left after gc ({gc_line})")

    def _copy_out(self) -> None:
        """The tmpfs out folder's ledger and files into ``out``, then the tmpfs is unmounted."""
        src = self.live / "ledger.sqlite"
        if src.exists():
            a, b = sqlite3.connect(src, timeout=60), sqlite3.connect(self.out / "ledger.sqlite")
            try:
                a.backup(b)
            finally:
                a.close()
                b.close()
        for p in self.live.iterdir():
            if p.name.startswith("ledger.sqlite") or p.name == ".chaos-fill":
                continue
            dest = self.out / p.name
            if p.is_dir():
                shutil.copytree(p, dest, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.copy2(p, dest)
        subprocess.run(["umount", str(self.live)], check=False, capture_output=True)
        self.mounted = False
        self.done = False  # the run was complete when an event stopped the harness: nothing to resume
        with contextlib.suppress(OSError):
            self.live.rmdir()


def check_only(out: Path, run_id: str) -> ChaosSummaryArtifact:
    """The ledger-only checks again on a finished chaos run (e.g. after the ledger was changed)."""
    ledger = Ledger(out / "ledger.sqlite")
    try:
        stored = artifacts.load(ledger, run_id, ChaosSummaryArtifact).get("summary")
        if stored is None:
            raise UsageError(f"--check: run {run_id} in {out} is not a finished chaos run")
        checks = {**stored.checks, **judge(ledger, run_id)}
        return stored.model_copy(update={"checks": checks, "attempts": ledger.count(run_id),
                                          "passed": all(c.passed for c in checks.values())})
    finally:
        ledger.close()
