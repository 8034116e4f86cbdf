"""Where DrumsBench keeps what lives outside a ledger: sandbox folders and the live-run registry.

A run registers itself (``register``) with its pid and the pid's start time; ``dead_runs`` are
registered runs whose process is gone — what ``drumsbench gc`` cleans up after.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def state_dir() -> Path:
    base = os.environ.get("DRUMSBENCH_STATE") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "drumsbench")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def register(run_id: str, substrates: list[str], ledger: Path | None = None) -> Path:
    """Record that this process runs ``run_id`` on ``substrates`` (what ``gc`` cleans when the process
    is gone), and the ledger that holds the run (``gc`` marks a dead run still ``running`` there as
    ``interrupted``: it can be resumed, never taken for one still going)."""
    folder = state_dir() / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_id}.json"
    pid = os.getpid()
    entry: dict[str, Any] = {"run_id": run_id, "pid": pid, "start": _start_time(pid), "substrates": substrates}
    if ledger is not None:
        entry["ledger"] = str(Path(ledger).resolve())
    path.write_text(json.dumps(entry))
    return path


def unregister(run_id: str) -> None:
    (state_dir() / "runs" / f"{run_id}.json").unlink(missing_ok=True)


def registered() -> list[dict[str, Any]]:
    out = []
    for p in sorted((state_dir() / "runs").glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def is_alive(entry: dict[str, Any]) -> bool:
    return entry.get("start") is not None and _start_time(int(entry["pid"])) == entry["start"]


def dead_runs() -> list[dict[str, Any]]:
    return [e for e in registered() if not is_alive(e)]
