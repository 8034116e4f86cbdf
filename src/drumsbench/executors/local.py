"""The in-process executor: ``concurrency`` workers, each a thread that owns one sandbox at a time.

Attempts run in worker threads (substrate calls block); records are handed to the sink on the
event loop's thread, so the ledger has one writer. SIGINT/SIGTERM stop the job: running commands
are killed by destroying the sandboxes, in-flight attempts are dropped (not recorded), and every
sandbox is destroyed before ``execute`` returns.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

import anyio
import anyio.to_thread

from drumsbench.core.records import AttemptRecord
from drumsbench.executors.base import Job
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates.base import Substrate


class LocalExecutor:
    name = "local"

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.interrupted = False

    def execute(self, job: Job, substrate: Substrate, sink: Callable[[AttemptRecord], None],
                tick: Callable[[], None] | None = None) -> None:
        anyio.run(self._main, job, substrate, sink, tick)

    async def _main(self, job: Job, substrate: Substrate, sink: Callable[[AttemptRecord], None],
                    tick: Callable[[], None] | None) -> None:
        limiter = anyio.CapacityLimiter(self.concurrency)
        host = socket.gethostname()
        slots = [job.make_slot(substrate, w) for w in range(self.concurrency)]
        meta: dict[str, object] = {"host": host, "executor": self.name, "concurrency": self.concurrency}

        async def worker(slot: Slot) -> None:
            policy = job.make_policy()
            try:
                while True:
                    work = job.next_work()
                    if work is None:
                        return
                    rec = await anyio.to_thread.run_sync(job.attempt, slot, policy, work, meta, limiter=limiter)
                    if job.stopped.is_set():
                        return  # interrupted: the attempt was cut short by the operator, not the infra
                    sink(rec)
            finally:
                await anyio.to_thread.run_sync(slot.destroy, limiter=limiter)

        async def signals(scope: anyio.CancelScope) -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
                async for _ in received:
                    self.interrupted = True
                    await anyio.to_thread.run_sync(job.stop)
                    return

        async def ticker() -> None:
            while tick is not None:
                tick()
                await anyio.sleep(0.25)

        async with anyio.create_task_group() as outer:
            outer.start_soon(signals, outer.cancel_scope)
            outer.start_soon(ticker)
            async with anyio.create_task_group() as workers:
                for slot in slots:
                    workers.start_soon(worker, slot)
            outer.cancel_scope.cancel()
        if tick is not None:
            tick()
