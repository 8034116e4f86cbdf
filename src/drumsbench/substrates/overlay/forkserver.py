"""The overlay substrate's host side: the run's fork server (``namespace_init.py``), the
background deletion of discarded layers, and what the host sees of a run (rootfs, mounts)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.exec_core import SANDBOX_PATH
from drumsbench.substrates.hostproc import mounts_below
from drumsbench.substrates.process import RUN_VAR

NAMESPACE_INIT = Path(__file__).with_name("namespace_init.py")


def cached_rootfs() -> Path | None:
    """The rootfs folder when already built (never builds)."""
    try:
        target = images.cache_dir() / f"rootfs-{images.recipe_hash()}"
    except SubstrateError:
        return None
    return target if (target / ".drumsbench-complete").exists() else None


# Mount points in the host's mount namespace at or below a folder (deepest first).
host_mounts_below = mounts_below


def wait_pidfd(pidfd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


class ForkServer:
    """The run's ``namespace_init.py`` process: one request/response line at a time."""

    def __init__(self, run_id: str, folder: Path) -> None:
        env = {
            "PATH": SANDBOX_PATH,
            "LANG": "C.UTF-8",
            RUN_VAR: run_id,
            "DRUMSBENCH_ROLE": "overlay-forkserver",
        }
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(NAMESPACE_INIT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=str(folder),
                start_new_session=True,
            )
        except OSError as e:
            raise SubstrateError(f"overlay: cannot start the fork server: {e}") from e
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, req: dict, timeout: float = 30.0) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            if self.proc.poll() is not None:
                raise SubstrateError(f"overlay: fork server exited ({self.proc.returncode})")
            try:
                self.proc.stdin.write(json.dumps(req).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as e:
                raise SubstrateError(f"overlay: fork server unreachable: {e}") from e
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise SubstrateError("overlay: no answer from the fork server")
        return json.loads(line)

    def stop(self) -> None:
        """Close its stdin: it kills its holders and exits."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Trash:
    """Deletes discarded layers on a background thread, so a reset need not wait for it.

    A folder is first renamed into ``<run>/trash`` (O(1)); ``drain`` waits until all are gone.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, path: Path) -> None:
        try:
            self.folder.mkdir(exist_ok=True)
            dest = self.folder / uuid.uuid4().hex[:12]
            os.rename(path, dest)
        except FileNotFoundError:
            return
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="overlay-trash", daemon=True)
                self._thread.start()
        self._queue.put(dest)

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            shutil.rmtree(path, ignore_errors=True)

    def drain(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)
