"""A sweep on a Ray cluster: N_max per node and for the cluster, and the coordination tax.

Each step window ``N<n>`` ran on every node (N per node); with two nodes or more it is followed by
a node-alone window ``node-N<n>`` on one node at the same N. N_max per node is the largest N whose
node-alone window is confirmed; N_max for the cluster the largest N whose cluster window is. The
coordination tax at N is ``1 - cluster rate / (nodes x node-alone rate)``: 0 when the cluster does
as well as its nodes would alone, higher when coordination (or, for nodes sharing one machine, the
machine's cores) costs throughput. Computed from judged windows only (``measure.windows``).
"""

from __future__ import annotations

from pydantic import BaseModel

from drumsbench.measure.reports import SweepReport
from drumsbench.measure.stats import Estimate, scale
from drumsbench.measure.windows import WindowVerdict

NODE_ALONE = "node-"  # label prefix of a node-alone (per-node baseline) window on Ray


class ClusterLevel(BaseModel):
    """One N on a Ray cluster: the cluster's window against nodes x the node-alone window."""

    concurrency: int  # per node
    nodes: int  # nodes that ran the cluster window
    cluster_window: str
    cluster_confirmed: bool
    cluster_per_hour: Estimate  # valid rollouts per hour of the whole cluster
    per_node_hour: list[float | None]  # each node's valid rollouts per hour in the cluster window
    alone_window: str | None
    alone_confirmed: bool | None
    alone_per_hour: Estimate | None  # one node alone, same N
    ideal_per_hour: float | None  # nodes x node-alone rate
    tax: Estimate | None  # 1 - cluster / ideal; interval from the ends of both rates' intervals (conservative)


class ClusterSummary(BaseModel):
    """N_max per node and for the cluster, and the coordination tax at each N (a Ray sweep)."""

    nodes: int
    hosts: int
    n_max_cluster: int | None  # per-node N of the largest confirmed cluster window (nodes x N at once)
    n_max_per_node: int | None  # largest N whose node-alone window is confirmed
    levels: list[ClusterLevel]
    note: str


class ClusterSweepReport(SweepReport):
    """A sweep on Ray: the sweep report and its cluster summary."""

    cluster: ClusterSummary


def coordination_tax(cluster: Estimate, alone: Estimate, nodes: int) -> Estimate | None:
    """``1 - cluster / (nodes x alone)`` (both rates on the same hosts, or both per host-hour on the
    same number of hosts); the interval from the ends of both rates' intervals (conservative).
    None when the node-alone rate is zero or unknown."""
    if not alone.value or cluster.value is None:
        return None
    ideal, lo_ideal, hi_ideal = nodes * alone.value, nodes * (alone.low or 0), nodes * (alone.high or 0)
    return Estimate(value=1 - cluster.value / ideal,
                    low=1 - (cluster.high or 0) / lo_ideal if lo_ideal else None,
                    high=1 - (cluster.low or 0) / hi_ideal if hi_ideal else None,
                    n=cluster.n, method="1 - cluster / (nodes x node-alone); ends of both intervals")


def cluster_summary(windows: list[WindowVerdict], steps: list[WindowVerdict], n_max: int | None) -> ClusterSummary:
    """The cluster's figures from the judged windows: each step ``N<n>`` against ``node-N<n>``."""
    by_label = {v.label: v for v in windows}
    levels = []
    for v in steps:
        alone = by_label.get(f"{NODE_ALONE}N{v.concurrency}")
        nodes = sum(1 for ln in v.nodes if ln.attempts) or 1
        cluster_rate = scale(v.valid_per_host_hour, v.host_count)
        alone_rate = scale(alone.valid_per_host_hour, alone.host_count) if alone else None
        ideal = nodes * alone_rate.value if alone_rate and alone_rate.value else None
        tax = coordination_tax(cluster_rate, alone_rate, nodes) if alone_rate is not None else None
        levels.append(ClusterLevel(
            concurrency=v.concurrency, nodes=nodes, cluster_window=v.label, cluster_confirmed=v.confirmed,
            cluster_per_hour=cluster_rate, per_node_hour=[ln.valid_per_node_hour.value for ln in v.nodes],
            alone_window=alone.label if alone else None, alone_confirmed=alone.confirmed if alone else None,
            alone_per_hour=alone_rate, ideal_per_hour=ideal, tax=tax))
    alone_ok = [lv.concurrency for lv in levels if lv.alone_confirmed]
    n_node = max(alone_ok, default=None)
    nodes = max((lv.nodes for lv in levels), default=1)
    hosts = max((v.host_count for v in steps), default=1)
    if not any(lv.alone_window for lv in levels):
        note = "one node: no node-alone baseline, no coordination tax"
    else:
        note = ("coordination tax = 1 - cluster rate / (nodes x node-alone rate) at the same N per node; "
                + ("nodes sharing one machine share its cores, so the tax includes that contention"
                   if hosts == 1 and nodes > 1 else "nodes on separate hosts"))
    return ClusterSummary(nodes=nodes, hosts=hosts, n_max_cluster=n_max, n_max_per_node=n_node, levels=levels,
                          note=note)
