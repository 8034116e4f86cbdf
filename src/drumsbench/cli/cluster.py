"""``drumsbench cluster up/down``: a real multi-node Ray cluster on this machine, loopback only."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Annotated

import typer

from drumsbench.cli.common import err


def cluster_up(
    nodes: Annotated[int, typer.Option(help="Ray nodes to start (a head and nodes - 1 more).")] = 2,
    cpus_per_node: Annotated[int, typer.Option(help="CPUs each node offers.")] = 1,
    object_store: Annotated[int, typer.Option(help="Object store of each node, MiB.")] = 100,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background (pid file in the state "
                                                          "folder); stop it with `drumsbench cluster down`.")] = False,
    timeout: Annotated[float, typer.Option(help="--detach: how long to wait for the cluster to start, s.")] = 300,
) -> None:
    """Start a multi-node Ray cluster on this machine, every socket on 127.0.0.1 (docs/ray.md).

    Prints the address and the token file to join it with; stays in the foreground until Ctrl-C
    unless --detach."""
    from drumsbench.core import host_state
    from drumsbench.core.errors import UsageError
    from drumsbench.executors import ray_cluster
    from drumsbench.executors.ray import missing

    if nodes < 1 or nodes > 16:
        raise UsageError("--nodes: give 1 to 16")
    if cpus_per_node < 1:
        raise UsageError("--cpus-per-node: give 1 or more")
    if object_store < 80:
        raise UsageError("--object-store: give at least 80 (MiB)")
    problem = missing()
    if problem:
        raise UsageError(f"cluster up: {problem}")
    state = host_state.state_dir()
    other = ray_cluster.running(state)
    if other is not None:
        raise UsageError(f"cluster up: a cluster is already running (pid {other.pid}, {other.address}); "
                         "`drumsbench cluster down` first")

    def show(info: ray_cluster.ClusterInfo) -> None:
        print(f"cluster of {info.nodes} node(s) on 127.0.0.1 (pid {info.pid})\n"
              f"address     {info.address}\ntoken file  {info.token_path}\nRAY_TMPDIR  {info.tmpdir}\n"
              f"join with:  {info.join_line()}", flush=True)

    if detach:
        ray_cluster.folder(state).mkdir(parents=True, exist_ok=True)
        log = ray_cluster.folder(state) / "cluster.log"
        args = [sys.executable, "-m", "drumsbench", "cluster", "up", "--nodes", str(nodes), "--cpus-per-node",
                str(cpus_per_node), "--object-store", str(object_store)]
        with open(log, "wb") as out:
            child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        info = ray_cluster.wait_ready(state, child.pid, timeout)
        if info is None:
            if child.poll() is None:
                child.terminate()
            raise UsageError(f"cluster up: the cluster did not start within {timeout:g} s: "
                             f"{ray_cluster.read_log_tail(log) or 'no output'}")
        show(info)
        err.print(f"running in the background; stop it with: drumsbench cluster down (log {log})")
        return

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    def ready(info: ray_cluster.ClusterInfo) -> None:
        show(info)
        err.print("Ctrl-C stops it")

    ray_cluster.serve(state, nodes, cpus_per_node, object_store * ray_cluster.MiB, stop, ready)
    err.print("cluster stopped; its temp folder removed")


def cluster_down(
    timeout: Annotated[float, typer.Option(help="How long to wait for the cluster to stop, s.")] = 60,
) -> None:
    """Stop the cluster `drumsbench cluster up --detach` started and remove what it left."""
    from drumsbench.core import host_state
    from drumsbench.executors import ray_cluster

    print(ray_cluster.down(host_state.state_dir(), timeout))
