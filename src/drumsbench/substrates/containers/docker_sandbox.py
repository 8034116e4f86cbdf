"""One sandbox of the ``docker`` substrate: a container of the real daemon, driven through the
Python SDK (exec over a hijacked socket, ``docker_wire``; files through the archive API; pause and
unpause; the engine's record as evidence). Also the SDK's guard, client and error types, which the
substrate (``docker``) uses too.

Exec: stdin is written then half-closed, the multiplexed output is read with a deadline and kept up
to ``output_limit`` bytes per stream. On timeout the host kills what carries the command's token
(``ContainerSandbox.kill_exec``). A stream (``Streaming``) is an exec whose socket two daemon threads relay to
pipes (``docker_wire.DockerStream``); closing it runs the same kill with its token.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    ExecRequest,
    ExecResult,
    SandboxFrozen,
    Stream,
)
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.containers import docker_wire

if TYPE_CHECKING:
    from drumsbench.substrates.containers.docker import DockerSubstrate

try:  # the SDK is optional: missing() says how to get it
    import docker
    import docker.errors
    import requests.exceptions

    HAVE_SDK = True
except ImportError:  # pragma: no cover - exercised only without the SDK
    HAVE_SDK = False

SOCKET_HINT = "run scripts/setup.sh (it starts dockerd --bridge=none --iptables=false)"


def connect(timeout: float = 60) -> Any:
    if not HAVE_SDK:
        raise SubstrateError("docker: the Python SDK is missing: pip install 'drumsbench[docker]'")
    try:
        return docker.from_env(version="auto", timeout=timeout)
    except docker.errors.DockerException as e:
        raise SubstrateError(f"docker: the daemon does not answer ({e}); {SOCKET_HINT}") from e


def api_errors() -> tuple[type[BaseException], ...]:
    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


class DockerSandbox(C.ContainerSandbox):
    def __init__(self, sub: DockerSubstrate, cid: str, sid: str) -> None:
        super().__init__(sub, cid, sid)
        self._api = sub.client.api
        self._unremoved = sub.unremoved

    def _upper_dir(self) -> Path:
        try:
            return Path(self._api.inspect_container(self.container_id)["GraphDriver"]["Data"]["UpperDir"])
        except (KeyError, TypeError) as e:
            raise SubstrateError(f"docker: sandbox {self.id}: no overlay upper folder in the engine's record "
                                 f"({e})") from e
        except api_errors() as e:
            raise self._gone(e, "inspect") from e

    def _engine_pid(self) -> int:
        try:
            return int(self._api.inspect_container(self.container_id)["State"]["Pid"] or 0)
        except api_errors() as e:
            raise self._gone(e, "inspect") from e

    # -- exec -----------------------------------------------------------------------------------
    def _gone(self, e: BaseException, what: str) -> SubstrateError:
        kind = SandboxFrozen if "is paused" in str(e) else SubstrateError
        return kind(f"docker: sandbox {self.id} ({self.container_id[:12]}): {what}: {e}")

    def _run_marked(self, req: ExecRequest, token: str, env: Mapping[str, str], user: str | None = None) -> ExecResult:
        t0 = time.monotonic()
        try:
            eid = self._api.exec_create(
                self.container_id,
                req.argv,
                stdout=True,
                stderr=True,
                stdin=req.stdin is not None,
                environment=[f"{k}={v}" for k, v in env.items()],
                workdir=req.cwd,
                user=user or "",
            )["Id"]
            sock = self._api.exec_start(eid, socket=True)
        except api_errors() as e:
            raise self._gone(e, "exec failed") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        try:
            if req.stdin is not None:
                self._send_stdin(raw, req.stdin)
            early = docker_wire.buffered_stream_bytes(sock, raw)
            out, err, totals, timed_out = docker_wire.read_frames(raw, t0 + req.timeout, req.output_limit, early)
            if timed_out:
                self._kill(token)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        code = -9 if timed_out else self._exit_code(eid)
        if code == 126 and not err and out.startswith(b"OCI runtime exec failed"):
            # The runtime could not start the program. In a container that stopped meanwhile
            # ("cannot exec in a stopped container") that is the sandbox's failure, never the
            # command's status: raised, for the caller to attribute from the engine's record (a
            # container its own memory limit killed is the policy's doing). Else say so on stderr,
            # as a shell (and podman) would, with 127 when the program does not exist.
            if not self._running():
                raise SubstrateError(f"docker: sandbox {self.id} ({self.container_id[:12]}): the container "
                                     f"stopped under the exec: {C.decode_tail(out)}")
            out, err = b"", out
            totals = [0, len(err)]
            if b"not found" in err or b"no such file" in err:
                code = 127
        return ExecResult(
            exit_code=code,
            stdout=out,
            stderr=err,
            stdout_total=totals[0],
            stderr_total=totals[1],
            timed_out=timed_out,
            duration_s=time.monotonic() - t0,
        )

    def _open_marked(self, argv: list[str], cwd: str, env: Mapping[str, str], token: str,
                     user: str | None = None) -> Stream:
        """An exec with stdin attached; its hijacked socket relayed to two pipes (``_DockerStream``)."""
        try:
            eid = self._api.exec_create(self.container_id, argv, stdout=True, stderr=True, stdin=True,
                                        environment=[f"{k}={v}" for k, v in env.items()], workdir=cwd,
                                        user=user or "")["Id"]
            sock = self._api.exec_start(eid, socket=True)
        except api_errors() as e:
            raise self._gone(e, "exec failed") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        early = docker_wire.buffered_stream_bytes(sock, raw)
        raw.setblocking(True)  # and no timeout: a stream may be silent for long
        return docker_wire.DockerStream(eid, sock, raw, early, lambda: self._exec_status(eid),
                                        lambda: self._kill(token))

    def _exec_status(self, eid: str) -> int | None:
        """The exit code of an exec that ended, else None (still running, or the daemon not answering)."""
        try:
            info = self._api.exec_inspect(eid)
        except docker.errors.NotFound:
            return -signal.SIGKILL  # the container is gone, and the exec with it
        except api_errors():
            return None
        if info.get("Running") or info.get("ExitCode") is None:
            return None
        return int(info["ExitCode"])

    def _running(self) -> bool:
        """The engine's record: does the container run? (False also when the engine does not know it.)"""
        try:
            return bool(self._api.inspect_container(self.container_id)["State"].get("Running"))
        except api_errors():
            return False

    @staticmethod
    def _send_stdin(raw: socket.socket, data: bytes) -> None:
        # Written from a thread so a command that does not read cannot block us past the deadline.
        def feed() -> None:
            with contextlib.suppress(OSError):
                raw.sendall(data)
                raw.shutdown(socket.SHUT_WR)

        if len(data) <= 65536:
            feed()
        else:
            threading.Thread(target=feed, daemon=True).start()

    def _exit_code(self, eid: str) -> int:
        deadline = time.monotonic() + 10
        while True:
            try:
                info = self._api.exec_inspect(eid)
            except api_errors() as e:
                raise self._gone(e, "exec inspect failed") from e
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                raise SubstrateError(
                    f"docker: sandbox {self.id}: exec ended but reports no exit code"
                )
            time.sleep(0.005)

    def _kill(self, token: str) -> None:
        """Kill every process of the exec that carries ``token`` (and their sessions), from the host."""
        self.kill_exec(token)

    # -- files ----------------------------------------------------------------------------------
    def _put(self, files: Mapping[str, bytes]) -> None:
        self._check()
        try:
            self._api.put_archive(self.container_id, "/", C.files_tar(files))
        except api_errors() as e:
            raise self._gone(e, f"cannot write {', '.join(list(files)[:3])}") from e

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        self._check()
        path = C.check_path(path)
        for _ in range(20):  # follow symlinks, as cat would
            try:
                stream, _stat = self._api.get_archive(self.container_id, path)
            except docker.errors.NotFound as e:
                if self._container_missing():
                    raise self._gone(e, "the container is gone") from e
                raise FileNotFoundError(path) from e
            except api_errors() as e:
                raise self._gone(e, f"cannot read {path}") from e
            try:
                with tarfile.open(fileobj=docker_wire.ChunkReader(stream), mode="r|") as tar:
                    member = tar.next()
                    if member is None:
                        raise FileNotFoundError(path)
                    if member.issym():
                        path = C.check_path(docker_wire.posixpath_join(path, member.linkname))
                        continue
                    if member.isdir():
                        raise IsADirectoryError(path)
                    f = tar.extractfile(member)
                    if f is None:
                        raise SubstrateError(f"docker: {path} is not a regular file")
                    return f.read(-1 if limit is None else limit)
            except (FileNotFoundError, IsADirectoryError):
                raise
            except (tarfile.TarError, docker.errors.DockerException, OSError) as e:
                raise self._gone(e, f"cannot read {path}") from e
            finally:
                with contextlib.suppress(Exception):
                    stream.close()
        raise SubstrateError(f"docker: too many levels of symbolic links at {path}")

    def _container_missing(self) -> bool:
        try:
            self._api.inspect_container(self.container_id)
            return False
        except docker.errors.NotFound:
            return True

    # -- destroy (its shape: ContainerSandbox.destroy) -------------------------------------------
    def _engine_remove(self) -> BaseException | None:
        try:
            self._api.remove_container(self.container_id, force=True)
        except docker.errors.NotFound:
            return None
        except api_errors() as e:
            return e
        return None

    def _engine_unpause_to_remove(self) -> BaseException | None:
        try:
            self._api.unpause(self.container_id)
        except docker.errors.APIError:
            return None  # refused (not paused, gone): removed again all the same
        except api_errors() as e:
            return e
        return None

    def _not_removed(self, first: BaseException, last: BaseException) -> NoReturn:
        # e.g. dockerd down (killed, restarting): the substrate tries again when it closes
        self._unremoved[self.container_id] = self.id
        raise self._gone(last, f"cannot remove the container ({first})") from last

    # -- gate-side evidence ----------------------------------------------------------------------
    def _inspect_state(self, wait: float) -> Mapping[str, Any] | str:
        wait = max(wait, 10.0)  # the daemon's own answer; a loaded host is slow, not absent
        try:
            resp = self._api._get(self._api._url("/containers/{0}/json", self.container_id), timeout=wait)
            return self._api._result(resp, True).get("State") or {}
        except docker.errors.NotFound:
            return f"docker: the container {self.container_id[:12]} is gone (the daemon does not know it)"
        except api_errors() as e:
            return f"docker: the daemon did not answer an inspect of the container within {wait:g} s: {e}"

    # -- host-side freeze (fault injection only) -------------------------------------------------
    def freeze(self) -> None:
        """``docker pause``: the cgroup freezer stops every process of the container."""
        self._check()
        try:
            self._api.pause(self.container_id)
        except api_errors() as e:
            raise self._gone(e, "cannot pause the container") from e

    def _engine_unpause(self) -> None:
        try:
            self._api.unpause(self.container_id)
        except docker.errors.APIError as e:
            if "is not paused" in str(e).lower():  # 409 or 500, depending on the daemon
                return  # idempotent
            raise self._gone(e, "cannot unpause the container") from e
        except api_errors() as e:
            raise self._gone(e, "cannot unpause the container") from e
