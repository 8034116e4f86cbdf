"""One sandbox of the ``podman`` substrate: a container driven through the podman CLI
(``podman_cli``: exec as ``podman exec`` bounded by ``exec_core.run_bounded``, files through ``tar`` in
the container, pause and unpause, the engine's record as evidence, a checkpoint of the whole
container through CRIU).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    ExecRequest,
    ExecResult,
    InitLaunching,
    LaunchView,
    SandboxFrozen,
    Stream,
)
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.containers import host_entry
from drumsbench.substrates.containers.podman_cli import configure, criu_errors, podman, with_criu, work_dir
from drumsbench.substrates.exec_core import SANDBOX_PATH, run_bounded, start_stream

if TYPE_CHECKING:
    from drumsbench.substrates.containers.podman import PodmanSubstrate

PODMAN_ERROR = 125  # podman's own failure (also a command's possible exit code: checked)
# podman exec's exit code when it cannot create the exec session (a paused or stopped container)
PODMAN_EXEC_REFUSED = 255
class PodmanSandbox(C.ContainerSandbox, InitLaunching):
    def __init__(self, sub: PodmanSubstrate, cid: str, sid: str) -> None:
        super().__init__(sub, cid, sid)
        self._exe = sub.exe
        self._env = configure()

    def init_view(self) -> LaunchView:
        return host_entry.init_view(self.entry(), C.ROOT)

    def _upper_dir(self) -> Path:
        proc = podman(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", self.container_id], check=False)
        upper = proc.stdout.decode().strip()
        if proc.returncode != 0 or not upper.startswith("/"):
            raise SubstrateError(f"podman: sandbox {self.id}: no overlay upper folder in the engine's record: "
                                 f"{C.decode_tail(proc.stderr)}")
        return Path(upper)

    def checkpoint_export(self, path: Path, timeout: float = 300.0) -> None:
        """``podman container checkpoint --leave-running --export PATH``: the whole container (its
        processes through CRIU, its file changes) into one archive; the container goes on."""
        self._check()
        path.parent.mkdir(parents=True, exist_ok=True)
        # --file-locks: LibreOffice holds locks on its document and profile
        proc = with_criu(self._exe, ["container", "checkpoint", "--leave-running", "--file-locks",
                                      f"--export={path}", self.container_id], timeout)
        if proc is None:
            path.unlink(missing_ok=True)
            raise SubstrateError(f"podman: checkpoint of {self.container_id[:12]}: no answer within {timeout:.0f} s")
        if proc.returncode != 0:
            path.unlink(missing_ok=True)
            raise SubstrateError(f"podman: checkpoint of {self.container_id[:12]} failed: "
                                 f"{criu_errors(proc.stderr) or C.decode_tail(proc.stderr)}")

    def _engine_pid(self) -> int:
        proc = podman(["container", "inspect", "--format", "{{.State.Pid}}", self.container_id], check=False)
        return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0

    def _running(self) -> bool:
        proc = podman(
            ["container", "inspect", "--format", "{{.State.Running}}", self.container_id],
            check=False,
        )
        return proc.returncode == 0 and proc.stdout.strip() == b"true"

    def _exec_argv(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], interactive: bool,
                   user: str | None = None) -> list[str]:
        """The ``podman exec`` command line of ``argv`` with exactly ``env``, as ``user`` (None: the
        image's ``USER``)."""
        cmd = [self._exe, "--log-level=error", "exec"]
        if interactive:
            cmd.append("--interactive")
        if user is not None:
            cmd += ["--user", user]
        cmd += ["--workdir", cwd]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        return [*cmd, self.container_id, *argv]

    def _podman_exec(self, req: ExecRequest, env: Mapping[str, str], user: str | None = None) -> ExecResult:
        """``podman exec`` of ``req`` with exactly ``env`` as ``user``, bounded and killed on timeout
        (the client: what it started in the container lives on)."""
        cmd = self._exec_argv(req.argv, req.cwd, env, req.stdin is not None, user)
        return run_bounded(
            cmd, timeout=req.timeout, cwd=str(work_dir()), env=self._env, stdin=req.stdin,
            output_limit=req.output_limit
        )

    def _open_marked(self, argv: list[str], cwd: str, env: Mapping[str, str], token: str,
                     user: str | None = None) -> Stream:
        """``podman exec --interactive``: the stream's pipes are the client's stdin and stdout (its exit
        status is the command's; a podman that refuses the exec, e.g. in a paused container, ends it at
        once with podman's own, 125 or 255). ``close`` kills the client, then what carries ``token`` in
        the container."""
        def kill_inside() -> None:
            with contextlib.suppress(SubstrateError):  # a container already gone: nothing of it runs
                self.kill_exec(token)

        return start_stream(self._exec_argv(argv, cwd, env, True, user), cwd=str(work_dir()), env=self._env,
                            on_close=kill_inside)

    def _run_marked(self, req: ExecRequest, token: str, env: Mapping[str, str], user: str | None = None) -> ExecResult:
        res = self._podman_exec(req, env, user)
        if res.timed_out:
            # run_bounded killed the podman client; the command lives on in the container.
            try:
                self.kill_exec(token)
            except SubstrateError:
                if not self._running():
                    raise SubstrateError(f"podman: sandbox {self.id}: the container is gone") from None
                raise
            return res
        if res.exit_code in (PODMAN_ERROR, PODMAN_EXEC_REFUSED) and self._paused():
            raise SandboxFrozen(f"podman: sandbox {self.id}: exec refused: {C.decode_tail(res.stderr)}")
        if res.exit_code in (PODMAN_ERROR, PODMAN_EXEC_REFUSED) and not self._running():
            raise SubstrateError(
                f"podman: sandbox {self.id}: exec failed, the container is not running: "
                f"{C.decode_tail(res.stderr)}"
            )
        return res

    def _paused(self) -> bool:
        """Podman's record: is the container paused (by the host)?"""
        proc = podman(["container", "inspect", "--format", "{{.State.Status}}", self.container_id], check=False)
        return proc.returncode == 0 and proc.stdout.strip() == b"paused"

    # -- files ----------------------------------------------------------------------------------
    def _put(self, files: Mapping[str, bytes]) -> None:
        self._check()
        # the harness's files, written as the container's root (as docker's put_archive does), whatever its USER
        res = self._podman_exec(ExecRequest(["tar", "-x", "-f", "-", "-C", "/", "--no-same-owner"], 120, "/",
                                            stdin=C.files_tar(files), output_limit=4096), {"PATH": SANDBOX_PATH}, "0")
        if res.exit_code != 0 or res.timed_out:
            if not self._running():
                raise SubstrateError(f"podman: sandbox {self.id}: the container is gone")
            raise SubstrateError(
                f"podman: sandbox {self.id}: cannot write {', '.join(list(files)[:3])}: "
                f"{C.decode_tail(res.stderr)}"
            )

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        self._check()
        path = C.check_path(path)
        argv = ["/bin/sh", "-c", C.READ_SCRIPT, "sh", path, "" if limit is None else str(limit)]
        res = self._podman_exec(ExecRequest(argv, 120, "/", output_limit=(1 << 62) if limit is None else max(limit, 1)),
                                {"PATH": SANDBOX_PATH}, "0")
        if res.exit_code == 0 and not res.timed_out:
            return res.stdout
        if res.exit_code == C.READ_MISSING:
            raise FileNotFoundError(path)
        if res.exit_code == C.READ_IS_DIR:
            raise IsADirectoryError(path)
        if not self._running():
            raise SubstrateError(f"podman: sandbox {self.id}: the container is gone")
        raise SubstrateError(
            f"podman: sandbox {self.id}: cannot read {path}: {C.decode_tail(res.stderr)}"
        )

    # -- destroy (its shape: ContainerSandbox.destroy) -------------------------------------------
    def _engine_remove(self) -> BaseException | None:
        proc = podman(["rm", "--force", "--time", "0", self.container_id], check=False)
        if proc.returncode == 0 or b"no such container" in proc.stderr.lower():
            return None
        return SubstrateError(f"podman: cannot remove {self.container_id[:12]}: {C.decode_tail(proc.stderr)}")

    def _engine_unpause_to_remove(self) -> BaseException | None:
        podman(["unpause", self.container_id], check=False)  # its refusal: removed again all the same
        return None

    # -- gate-side evidence ----------------------------------------------------------------------
    def _inspect_state(self, wait: float) -> Mapping[str, Any] | str:
        wait = max(wait, 15.0)  # a CLI process on a loaded host is slow, not absent
        try:
            proc = podman(["container", "inspect", "--format", "json", self.container_id],
                          check=False, timeout=wait)
        except SubstrateError as e:
            return f"podman: no answer to an inspect of the container: {e}"
        if proc.returncode != 0:
            if b"no such" in proc.stderr.lower():
                return f"podman: the container {self.container_id[:12]} is gone"
            return f"podman: inspect of the container failed: {C.decode_tail(proc.stderr)}"
        try:
            state = (json.loads(proc.stdout) or [{}])[0].get("State") or {}
        except (ValueError, IndexError, AttributeError) as e:
            return f"podman: unreadable inspect of the container: {e}"
        return state if isinstance(state, dict) else f"podman: unreadable inspect of the container: {state!r}"

    # -- host-side freeze (fault injection only) -------------------------------------------------
    def freeze(self) -> None:
        """``podman pause``: the cgroup freezer stops every process of the container."""
        self._check()
        podman(["pause", self.container_id])

    def _engine_unpause(self) -> None:
        proc = podman(["unpause", self.container_id], check=False)
        if proc.returncode != 0 and b"not paused" not in proc.stderr.lower() \
                and b"state improper" not in proc.stderr.lower():
            raise SubstrateError(f"podman: cannot unpause {self.container_id[:12]}: "
                                 f"{C.decode_tail(proc.stderr)}")
