"""``drumsbench gc``: remove what crashed runs left behind."""

from __future__ import annotations

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
    for run_id in ids:
        state.unregister(run_id)
    console.print(f"gc: {len(ids)} dead run(s); removed {len(removed)} thing(s)")
    for line in removed:
        console.print(f"  {line}")
