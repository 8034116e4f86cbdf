"""The ledger: an append-only SQLite (WAL) record of every run, segment and attempt.

Contracts:
- Each attempt is written in its own transaction together with its segment's heartbeat, so a
  crash or ``kill -9`` loses no attempt that was recorded, and the segment's end time is never
  older than its last attempt.
- ``(run_id, seq)`` is the attempt's key: an attempt is recorded at most once; a resumed run
  continues with sequence numbers after the largest recorded one.
- Host time of a run = the sum of its segments' lengths (a resumed run does not count the time
  it was dead).
- Reports are built from the ledger alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drumsbench.core.errors import UsageError
from drumsbench.core.records import AttemptRecord

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    created REAL NOT NULL,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    machine TEXT NOT NULL,
    commit_sha TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS segments (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seg INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    pid INTEGER NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, seg)
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    task TEXT NOT NULL,
    substrate TEXT NOT NULL,
    env TEXT NOT NULL,
    policy TEXT NOT NULL,
    executor TEXT NOT NULL,
    host TEXT NOT NULL,
    worker INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    window TEXT NOT NULL,
    generation INTEGER NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('success', 'failed', 'invalid')),
    cause TEXT,
    reward REAL,
    injected TEXT,
    detail TEXT NOT NULL,
    t_start REAL NOT NULL,
    t_end REAL NOT NULL,
    provision_s REAL NOT NULL,
    reset_s REAL NOT NULL,
    steps_s TEXT NOT NULL,
    n_steps INTEGER NOT NULL,
    verify_s REAL NOT NULL,
    teardown_s REAL NOT NULL,
    extra TEXT NOT NULL,
    PRIMARY KEY (run_id, seq),
    CHECK ((outcome = 'invalid') = (cause IS NOT NULL)),
    CHECK ((outcome = 'invalid') = (reward IS NULL))
);
CREATE TABLE IF NOT EXISTS controls (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    window TEXT NOT NULL,
    kind TEXT NOT NULL,
    fired INTEGER NOT NULL,
    detail TEXT NOT NULL,
    t REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS artifacts (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    t REAL NOT NULL,
    PRIMARY KEY (run_id, kind, name)
);
"""

ATTEMPT_COLUMNS = (
    "run_id", "seq", "task", "substrate", "env", "policy", "executor", "host", "worker", "concurrency",
    "window", "generation", "outcome", "cause", "reward", "injected", "detail", "t_start", "t_end",
    "provision_s", "reset_s", "steps_s", "n_steps", "verify_s", "teardown_s", "extra",
)


class Ledger:
    """One SQLite file; one writer (the driver). Opening creates the schema when absent."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            if not self.path.parent.exists():  # a new out folder is its owner's alone (artifacts go there)
                self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            if not self.path.exists():  # made its owner's alone before SQLite opens it (see _private)
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self._private()
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)
            with self.tx():
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except (OSError, sqlite3.OperationalError) as e:
            raise UsageError(f"--out: cannot open the ledger at {self.path} ({e}); choose a writable folder") from None
        version = int(self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise UsageError(f"{self.path}: ledger schema {version}, this DrumsBench reads {SCHEMA_VERSION}")

    def _private(self) -> None:
        """The ledger holds every action of every attempt — an oracle's are the answer key — and the
        run's details: its file and SQLite's -wal and -shm beside it are readable by their owner
        alone (a sandbox's uid on ``process`` reads whatever any user can). A ledger of another
        user is left as it is."""
        for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            with contextlib.suppress(OSError):
                st = p.stat()
                if st.st_uid == os.geteuid() and st.st_mode & 0o077:
                    os.chmod(p, st.st_mode & 0o700)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error:  # e.g. a full disk: leave no transaction open behind the error
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()

    # -- runs and segments ---------------------------------------------------------------------
    def create_run(self, run_id: str, kind: str, config: dict[str, Any], machine: dict[str, Any], commit: str) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, 'running', ?, ?, ?)",
                       (run_id, kind, time.time(), json.dumps(config), json.dumps(machine), commit))

    def run(self, run_id: str) -> dict[str, Any]:
        row = self.db.execute("SELECT run_id, kind, created, status, config, machine, commit_sha FROM runs "
                              "WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r[0] for r in self.db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 5")]
            raise UsageError(f"run {run_id!r} is not in {self.path}; recent runs: {', '.join(known) or 'none'}")
        return {"run_id": row[0], "kind": row[1], "created": row[2], "status": row[3],
                "config": json.loads(row[4]), "machine": json.loads(row[5]), "commit": row[6]}

    def runs(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT run_id FROM runs ORDER BY created")]

    def set_status(self, run_id: str, status: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE runs SET status = ? WHERE run_id = ?", (status, run_id))

    def start_segment(self, run_id: str, pid: int, label: str = "") -> int:
        now = time.time()
        with self.tx() as db:
            seg = db.execute("SELECT COALESCE(MAX(seg), -1) + 1 FROM segments WHERE run_id = ?",
                             (run_id,)).fetchone()[0]
            db.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?)", (run_id, seg, now, now, pid, label))
        return int(seg)

    def heartbeat(self, run_id: str, seg: int) -> None:
        with self.tx() as db:
            db.execute("UPDATE segments SET ended = ? WHERE run_id = ? AND seg = ?", (time.time(), run_id, seg))

    def segments(self, run_id: str) -> list[tuple[float, float, str]]:
        return [(r[0], r[1], r[2]) for r in self.db.execute(
            "SELECT started, ended, label FROM segments WHERE run_id = ? ORDER BY seg", (run_id,))]

    # -- attempts ------------------------------------------------------------------------------
    def record(self, rec: AttemptRecord, seg: int | None = None) -> None:
        """Append one attempt (and the segment heartbeat) in one transaction."""
        row = (
            rec.run_id, rec.seq, rec.task, rec.substrate, rec.env, rec.policy, rec.executor, rec.host,
            rec.worker, rec.concurrency, rec.window, rec.generation, rec.outcome.value,
            rec.cause.value if rec.cause else None, rec.reward, rec.injected.value if rec.injected else None,
            rec.detail, rec.t_start, rec.t_end, rec.provision_s, rec.reset_s, json.dumps(rec.steps_s),
            len(rec.steps_s), rec.verify_s, rec.teardown_s, json.dumps(rec.extra),
        )
        with self.tx() as db:
            db.execute(f"INSERT INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) VALUES "
                       f"({', '.join('?' * len(ATTEMPT_COLUMNS))})", row)
            if seg is not None:
                db.execute("UPDATE segments SET ended = MAX(ended, ?) WHERE run_id = ? AND seg = ?",
                           (time.time(), rec.run_id, seg))

    def next_seq(self, run_id: str) -> int:
        return int(self.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM attempts WHERE run_id = ?",
                                   (run_id,)).fetchone()[0])

    def count(self, run_id: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM attempts WHERE run_id = ?", (run_id,)).fetchone()[0])

    def attempts(self, run_id: str, columns: tuple[str, ...] = ATTEMPT_COLUMNS) -> list[tuple[Any, ...]]:
        return self.db.execute(f"SELECT {', '.join(columns)} FROM attempts WHERE run_id = ? ORDER BY seq",
                               (run_id,)).fetchall()

    # -- controls and artifacts ------------------------------------------------------------------
    def record_control(self, run_id: str, window: str, kind: str, fired: bool, detail: str) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO controls VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, window, kind, int(fired), detail, time.time()))

    def controls(self, run_id: str) -> list[dict[str, Any]]:
        return [{"window": r[0], "kind": r[1], "fired": bool(r[2]), "detail": r[3]} for r in self.db.execute(
            "SELECT window, kind, fired, detail FROM controls WHERE run_id = ? ORDER BY t", (run_id,))]

    def put_artifact(self, run_id: str, kind: str, name: str, data: Any) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO artifacts VALUES (?, ?, ?, ?, ?)",
                       (run_id, kind, name, json.dumps(data), time.time()))

    def artifacts(self, run_id: str, kind: str) -> dict[str, Any]:
        return {r[0]: json.loads(r[1]) for r in self.db.execute(
            "SELECT name, data FROM artifacts WHERE run_id = ? AND kind = ? ORDER BY t", (run_id, kind))}
