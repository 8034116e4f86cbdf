"""Per-client counts of a served run, from the ledger alone (``extra.client`` of each attempt)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from drumsbench.ledger import Ledger


def client_counts(ledger: Ledger, run_id: str) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for client, outcome, k in ledger.db.execute(
            "SELECT COALESCE(json_extract(extra, '$.client'), 'anonymous'), outcome, COUNT(*) FROM attempts "
            "WHERE run_id = ? GROUP BY 1, 2", (run_id,)):
        line = counts.setdefault(client, {"attempts": 0, "success": 0, "failed": 0, "invalid": 0})
        line[outcome] += k
        line["attempts"] += k
    return dict(sorted(counts.items()))


def print_clients(ledger: Ledger, run_id: str, console: Console) -> dict[str, Any]:
    counts = client_counts(ledger, run_id)
    t = Table(title="per client (served run)", show_edge=False)
    for col in ("client", "attempts", "success", "failed", "invalid"):
        t.add_column(col, justify="left" if col == "client" else "right")
    for client, c in counts.items():
        t.add_row(client, *(str(c[k]) for k in ("attempts", "success", "failed", "invalid")))
    console.print(t)
    return counts
