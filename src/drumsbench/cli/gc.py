"""``drumsbench gc``: remove what crashed runs left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drumsbench.cli.common import console, err


def gc() -> None:
    """Remove what crashed runs left behind: sandboxes, containers, mounts, processes."""
    from drumsbench.core import host_state as state
    from drumsbench.substrates import registry

    dead = state.dead_runs()
    ids = {e["run_id"] for e in dead}
    removed: list[str] = []
    for name in registry.names():
        try:
            cls = registry.get(name)
        except Exception as e:
            err.print(f"gc: cannot load substrate {name}: {e}")
            continue
        if cls.missing() is None:
            removed += cls.gc(state.state_dir(), ids)
    for entry in dead:
        marked = _mark_interrupted(entry)
        if marked:
            removed.append(marked)
    for run_id in ids:
        state.unregister(run_id)
    console.print(f"gc: {len(ids)} dead run(s); removed {len(removed)} thing(s)")
    for line in removed:
        console.print(f"  {line}")


def _mark_interrupted(entry: dict[str, Any]) -> str | None:
    """A dead run that its ledger still calls ``running`` becomes ``interrupted`` there (``run
    --resume`` continues it); one line saying so, or None."""
    from drumsbench.ledger import Ledger

    path = entry.get("ledger")
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    try:
        ledger = Ledger(Path(path))
        try:
            if ledger.run(str(entry["run_id"]))["status"] != "running":
                return None
            ledger.set_status(str(entry["run_id"]), "interrupted")
        finally:
            ledger.close()
    except Exception as e:  # a ledger that cannot be read: say so, clean the rest
        err.print(f"gc: run {entry['run_id']}: its ledger {path} could not be updated: {e}")
        return None
    return f"run {entry['run_id']} marked interrupted in {path}"
