"""A real multi-node Ray cluster on this one machine, on loopback (``drumsbench cluster up/down``).

``ray start`` cannot add a second node on one machine under the loopback settings (docs/ray.md),
so the nodes are started with ``ray.cluster_utils.Cluster``: a head and ``nodes - 1`` more, each
with ``cpus`` CPUs, a capped object store and a custom resource ``node_<i>``, every socket on
127.0.0.1, a token of the cluster's own, and a lost node marked dead in about a second.

The process that calls ``serve`` owns the cluster: it stays until ``stop`` is set (Ctrl-C,
SIGTERM) and then stops every node it started. Its pid and what a driver needs to join (address,
token file, Ray temp folder) are kept in ``<state>/ray-cluster/cluster.json`` while it runs;
``down`` stops it by that pid and removes what is left (processes found by the cluster's own
``RAY_TMPDIR``, the cluster's temp folder, the state files).

This module imports Ray only inside ``serve``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from drumsbench.core.errors import UsageError
from drumsbench.core.host_state import alive
from drumsbench.executors import ray_env

MiB = 1024 * 1024


class ClusterInfo(BaseModel):
    """What a driver needs to join the cluster, and who owns it."""

    pid: int
    address: str
    token_path: str
    tmpdir: str
    folder: str  # the cluster's own temp folder (token + Ray temp dir), removed by ``down``
    nodes: int
    started: float

    def join_line(self, command: str = "sweep") -> str:
        return (f"RAY_AUTH_TOKEN_PATH={self.token_path} drumsbench {command} --executor ray "
                f"--ray-address {self.address}")


def folder(state: Path) -> Path:
    return state / "ray-cluster"


def info_path(state: Path) -> Path:
    return folder(state) / "cluster.json"


def pid_path(state: Path) -> Path:
    return folder(state) / "cluster.pid"


def running(state: Path) -> ClusterInfo | None:
    """The cluster of this state folder when its owner is alive, else None."""
    try:
        info = ClusterInfo.model_validate_json(info_path(state).read_text())
    except (OSError, ValueError):
        return None
    return info if alive(info.pid) else None


def serve(state: Path, nodes: int, cpus: int, object_store_bytes: int, stop: threading.Event,
          on_ready: Callable[[ClusterInfo], None]) -> None:
    """Start the cluster, call ``on_ready``, wait for ``stop``, then stop every node (see the module)."""
    if nodes < 1:
        raise UsageError("--nodes: give 1 or more")
    other = running(state)
    if other is not None:
        raise UsageError(f"cluster up: a cluster is already running from {state} (pid {other.pid}); "
                         "`drumsbench cluster down` first")
    folder(state).mkdir(parents=True, exist_ok=True)
    pid_path(state).write_text(f"{os.getpid()}\n")
    env = ray_env.apply(new_token=True)  # before Ray is imported: children inherit it
    c = None
    try:
        from ray.cluster_utils import Cluster

        common: dict[str, Any] = {"node_ip_address": ray_env.LOOPBACK, "num_cpus": cpus,
                                  "object_store_memory": object_store_bytes}
        c = Cluster(initialize_head=True, head_node_args={
            **common, "include_dashboard": False, "resources": {"node_1": 1},
            "_system_config": ray_env.health_check_config(fast=True)})
        for i in range(2, nodes + 1):
            c.add_node(**common, resources={f"node_{i}": 1})
        info = ClusterInfo(pid=os.getpid(), address=c.address, token_path=env.token_path, tmpdir=env.tmpdir,
                           folder=str(env.folder), nodes=nodes, started=time.time())
        info_path(state).write_text(info.model_dump_json(indent=1))
        on_ready(info)
        stop.wait()
    finally:
        if c is not None:
            with contextlib.suppress(Exception):
                c.shutdown()
        env.restore()  # stops what is left of its Ray processes  # removes the token and Ray's temp folder
        for p in (info_path(state), pid_path(state)):
            p.unlink(missing_ok=True)


def down(state: Path, timeout_s: float = 60.0) -> str:
    """Stop the cluster of ``state`` and remove what it left; returns one line saying what was done."""
    try:
        info: ClusterInfo | None = ClusterInfo.model_validate_json(info_path(state).read_text())
    except (OSError, ValueError):
        info = None
    pid = info.pid if info else None
    if pid is None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_path(state).read_text().strip())
    if pid is None:
        return f"no cluster is running from {state}"
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    reaped: list[int] = []
    if info is not None:
        reaped = ray_env.remove(Path(info.folder), info.tmpdir)
    for p in (info_path(state), pid_path(state), folder(state) / "cluster.log"):
        p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder(state).rmdir()
    extra = f"; {len(reaped)} leftover Ray process(es) stopped" if reaped else ""
    return f"cluster (pid {pid}) stopped{extra}; its temp folder removed"


def wait_ready(state: Path, child: int, timeout_s: float) -> ClusterInfo | None:
    """The cluster's info once the detached owner ``child`` wrote it (None: it died or timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = running(state)
        if info is not None and info.pid == child:
            return info
        if not alive(child):
            return None
        time.sleep(0.3)
    return None


def read_log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
