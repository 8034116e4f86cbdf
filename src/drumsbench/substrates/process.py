"""``process``: each sandbox is a folder on the host and commands are plain host processes.

It gives **no isolation**: a command can read and write anything the user can. HOME and TMPDIR
point inside the sandbox so that well-behaved tools stay in it, and every process a command
starts runs in its own session; destroy kills those sessions and any process still carrying the
sandbox's label in its environment. It is the baseline every other substrate is compared with.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from drumsbench.errors import SubstrateError
from drumsbench.fingerprint import tree_digest
from drumsbench.scan import scan_tokens
from drumsbench.substrates.base import (
    DEFAULT_OUTPUT_LIMIT,
    Capabilities,
    ExecResult,
    Isolation,
    ResetStrategy,
    Sandbox,
    SandboxPaths,
    Substrate,
)
from drumsbench.substrates.hostproc import kill_group, kill_pids, pids_with_env, run_bounded

RUN_VAR = "DRUMSBENCH_RUN"
SANDBOX_VAR = "DRUMSBENCH_SANDBOX"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_root(state_dir: Path, run_id: str) -> Path:
    return state_dir / "sandboxes" / run_id


def host_leftovers(run_id: str, folder: Path) -> list[str]:
    """Host processes labelled with ``run_id`` and sandbox folders still under ``folder``."""
    left = [f"process {pid}" for pid in pids_with_env(RUN_VAR, run_id)]
    if folder.is_dir():
        left += [f"folder {p}" for p in folder.iterdir()]
    return left


def gc_host_runs(dead_runs: set[str], folder_of: Callable[[str], Path]) -> list[str]:
    """Kill the labelled processes of ``dead_runs`` and remove their folders; one line per thing."""
    removed = []
    for pid, run in pids_with_env(RUN_VAR).items():
        if run in dead_runs:
            kill_pids([pid])
            removed.append(f"process {pid} of run {run}")
    for run in dead_runs:
        folder = folder_of(run)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(f"folder {folder}")
    return removed


def new_sandbox_id() -> str:
    return uuid.uuid4().hex[:12]


class HostFolderSandbox(Sandbox):
    """A sandbox whose files live in a host folder: file methods act on the host directly.

    Subclasses choose how commands run (``_argv``) and how paths map (``host_path``).
    """

    def __init__(self, substrate: str, run_id: str, sid: str, host_root: Path, paths: SandboxPaths):
        self.substrate = substrate
        self.run_id = run_id
        self.id = sid
        self.host_root = host_root
        self.paths = paths
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._destroyed = False
        for sub in ("work", "home", "tmp", "verify"):
            (host_root / sub).mkdir(parents=True, exist_ok=True)

    # -- mapping -------------------------------------------------------------------------------
    def host_path(self, path: str) -> Path:
        """Host path of an in-sandbox absolute path; refuses paths outside the sandbox."""
        if self._destroyed:
            raise SubstrateError(f"sandbox {self.id} is destroyed")
        root = self.paths.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            raise SubstrateError(f"{path!r} is outside sandbox {self.id} ({root})")
        host = Path(os.path.normpath(self.host_root / os.path.relpath(path, root)))
        if host != self.host_root and self.host_root not in host.parents:
            raise SubstrateError(f"{path!r} escapes sandbox {self.id}")
        return host

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {
            "PATH": HOST_PATH,
            "HOME": self.paths.home,
            "TMPDIR": self.paths.tmp,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            RUN_VAR: self.run_id,
            SANDBOX_VAR: self.id,
        }
        if extra:
            env.update(extra)
        return env

    def _argv(self, argv: list[str], cwd: str, env: dict[str, str]) -> tuple[list[str], str | None, dict[str, str]]:
        """(host argv, host cwd, host env) for an in-sandbox command."""
        return argv, str(self.host_path(cwd)), env

    # -- interface -----------------------------------------------------------------------------
    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        host_argv, host_cwd, host_env = self._argv(argv, cwd or self.paths.work, self._env(env))
        if host_cwd is not None and not os.path.isdir(host_cwd):
            raise SubstrateError(f"sandbox {self.id}: working folder {host_cwd} is gone")

        def remember(pid: int) -> None:
            with self._lock:
                self._groups.add(pid)

        started: list[int] = []

        def remember_this(pid: int) -> None:
            started.append(pid)
            remember(pid)

        res = run_bounded(
            host_argv,
            timeout=timeout,
            cwd=host_cwd,
            env=host_env,
            stdin=stdin,
            output_limit=output_limit,
            on_start=remember_this,
        )
        # Forget a process group once it is empty: its id may be reused by an unrelated group.
        for pgid in started:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                with self._lock:
                    self._groups.discard(pgid)
            except PermissionError:
                pass
        return res

    def write_file(self, path: str, data: bytes) -> None:
        host = self.host_path(path)
        try:
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_bytes(data)
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot write {path}: {e}") from e

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        host = self.host_path(path)
        try:
            with open(host, "rb") as f:
                return f.read(-1 if limit is None else limit)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise SubstrateError(f"sandbox {self.id}: cannot read {path}: {e}") from e

    def tree_digest(self, path: str) -> str:
        return tree_digest(str(self.host_path(path)))

    def scan(self, folders: Sequence[str], tokens: Sequence[str]) -> set[str]:
        return scan_tokens([str(self.host_path(f)) for f in folders], list(tokens))

    def kill_all(self) -> None:
        """Kill every process this sandbox started, including ones that left their session."""
        with self._lock:
            groups, self._groups = self._groups, set()
        for pgid in groups:
            kill_group(pgid)
        kill_pids(list(pids_with_env(SANDBOX_VAR, self.id)))

    def reset_in_place(self) -> None:
        self.kill_all()
        for sub in ("work", "home", "tmp", "verify"):
            folder = self.host_root / sub
            shutil.rmtree(folder, ignore_errors=True)
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SubstrateError(f"sandbox {self.id}: cannot recreate {sub}: {e}") from e

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.kill_all()
        shutil.rmtree(self.host_root, ignore_errors=True)


class ProcessSandbox(HostFolderSandbox):
    """In-sandbox paths are the host paths."""


class ProcessSubstrate(Substrate):
    name = "process"
    capabilities = Capabilities(
        isolation=Isolation.NONE,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        network=True,
        notes="plain host processes: no isolation of files, processes or network",
    )

    @classmethod
    def missing(cls) -> str | None:
        return None

    def create(self) -> Sandbox:
        sid = new_sandbox_id()
        root = sandbox_root(self.state_dir, self.run_id) / sid
        try:
            root.mkdir(parents=True)
        except OSError as e:
            raise SubstrateError(f"process: cannot create sandbox folder {root}: {e}") from e
        r = str(root)
        paths = SandboxPaths(root=r, work=f"{r}/work", home=f"{r}/home", tmp=f"{r}/tmp", verify=f"{r}/verify")
        return ProcessSandbox(self.name, self.run_id, sid, root, paths)

    def close(self) -> None:
        """The run is over: nothing of it may remain, even what a sandbox lost track of."""
        kill_pids(list(pids_with_env(RUN_VAR, self.run_id)))
        shutil.rmtree(sandbox_root(self.state_dir, self.run_id), ignore_errors=True)

    def raw_floor(self) -> list[str] | None:
        return ["true"]

    def leftovers(self) -> list[str]:
        return host_leftovers(self.run_id, sandbox_root(self.state_dir, self.run_id))

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        return gc_host_runs(dead_runs, lambda run: sandbox_root(state_dir, run))
