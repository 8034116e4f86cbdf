"""``docker``: each sandbox is a container of the real Docker daemon, driven through the Python SDK.

Isolation: a container (own mount, pid, ipc, uts and network namespaces, a cgroup with a pids
and a memory limit), **no network at all** (``network_mode="none"``: only ``lo``). Commands run
as root inside the container with Docker's default capability set and ``no-new-privileges``.

Set-up: ``scripts/setup.sh`` installs docker.io and starts ``dockerd --bridge=none
--iptables=false``. The image (``containers.sandbox_tag()``) is built on first use if absent: the
Debian rootfs of ``drumsbench.images`` is imported under ``images.rootfs_tag()`` and the sandbox
layer committed on top (``python -m drumsbench.substrates.containers.docker ensure-image`` does it ahead).

Exec uses the exec API over a hijacked socket: stdin is written then half-closed, the multiplexed
output is read with a deadline and kept up to ``output_limit`` bytes per stream. On timeout a
second exec runs ``containers.KILL_SCRIPT`` with the command's token. A stream (``Streaming``) is
an exec whose socket two daemon threads relay to pipes (``_DockerStream``); closing it runs the
same kill with its token.

Known Docker behaviour: when a command leaves a background process holding its stdout or stderr,
the daemon keeps the exec's stream open for about 2 s after the command exits (and the next exec
in that container may wait about as long). Redirect the output of background processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import select
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import (
    Capabilities,
    ExecRequest,
    ExecResult,
    Isolation,
    ResetStrategy,
    SandboxFrozen,
    Stream,
)
from drumsbench.substrates.containers import common as C
from drumsbench.substrates.exec_core import SANDBOX_PATH, HeadTail, PipeStream
from drumsbench.substrates.hostproc import mounts_of_source

try:  # the SDK is optional: missing() says how to get it
    import docker
    import docker.errors
    import requests.exceptions

    HAVE_SDK = True
except ImportError:  # pragma: no cover - exercised only without the SDK
    HAVE_SDK = False

SOCKET_HINT = "run scripts/setup.sh (it starts dockerd --bridge=none --iptables=false)"
_HEADER = struct.Struct(">BxxxL")


def _client(timeout: float = 60) -> Any:
    if not HAVE_SDK:
        raise SubstrateError("docker: the Python SDK is missing: pip install 'drumsbench[docker]'")
    try:
        return docker.from_env(version="auto", timeout=timeout)
    except docker.errors.DockerException as e:
        raise SubstrateError(f"docker: the daemon does not answer ({e}); {SOCKET_HINT}") from e


def _api_errors() -> tuple[type[BaseException], ...]:
    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.api.inspect_image(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(client: Any | None = None, flavor: str = "base") -> str:
    """The sandbox image's tag of rootfs ``flavor``, importing the rootfs and building the layer
    first when absent."""
    if client is None:
        client = _client(timeout=900)
        try:
            return ensure_image(client, flavor)
        finally:
            client.close()
    tag = C.sandbox_tag(flavor)
    if image_exists(client, tag):
        return tag
    with C.build_lock("docker-image"):
        if image_exists(client, tag):
            return tag
        t0 = time.monotonic()
        rootfs = images.rootfs_tag(flavor)
        if not image_exists(client, rootfs):
            tar = C.ensure_rootfs_tar_verbose("docker", flavor)
            C.progress(f"docker: importing {tar.name} as {rootfs} (a few seconds, once)")
            repo, _, rtag = rootfs.partition(":")
            try:
                client.api.import_image_from_file(str(tar), repository=repo, tag=rtag)
            except _api_errors() as e:
                raise SubstrateError(f"docker: import of {tar} failed: {e}") from e
            if not image_exists(client, rootfs):
                raise SubstrateError(f"docker: import of {tar} did not produce {rootfs}")
        C.progress(f"docker: building the sandbox image {tag}")
        repo, _, stag = tag.partition(":")
        build = None
        with contextlib.suppress(docker.errors.NotFound):  # left by a crashed build
            client.api.remove_container(C.build_name(tag), force=True)
        try:
            build = client.api.create_container(
                rootfs,
                command=["true"],
                name=C.build_name(tag),
                host_config=client.api.create_host_config(network_mode="none"),
            )["Id"]
            client.api.put_archive(build, "/", C.layer_tar())
            client.api.commit(
                build,
                repository=repo,
                tag=stag,
                conf={
                    "Cmd": C.REAPER_ARGV,
                    "WorkingDir": C.PATHS.work,
                    "Env": [f"PATH={SANDBOX_PATH}", f"HOME={C.PATHS.home}"],
                    "Labels": {"drumsbench.image": C.image_label(flavor), "drumsbench.rootfs": rootfs},
                },
            )
        except _api_errors() as e:
            raise SubstrateError(f"docker: building {tag} failed: {e}") from e
        finally:
            if build is not None:
                with contextlib.suppress(*_api_errors()):
                    client.api.remove_container(build, force=True)
        C.progress(f"docker: {tag} ready ({time.monotonic() - t0:.1f} s)")
        return tag


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
        except _api_errors() as e:
            raise self._gone(e, "inspect") from e

    def _engine_pid(self) -> int:
        try:
            return int(self._api.inspect_container(self.container_id)["State"]["Pid"] or 0)
        except _api_errors() as e:
            raise self._gone(e, "inspect") from e

    # -- exec -----------------------------------------------------------------------------------
    def _gone(self, e: BaseException, what: str) -> SubstrateError:
        kind = SandboxFrozen if "is paused" in str(e) else SubstrateError
        return kind(f"docker: sandbox {self.id} ({self.container_id[:12]}): {what}: {e}")

    def _run_marked(self, req: ExecRequest, token: str, env: Mapping[str, str]) -> ExecResult:
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
            )["Id"]
            sock = self._api.exec_start(eid, socket=True)
        except _api_errors() as e:
            raise self._gone(e, "exec failed") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        try:
            if req.stdin is not None:
                self._send_stdin(raw, req.stdin)
            early = _buffered_stream_bytes(sock, raw)
            out, err, totals, timed_out = _read_frames(raw, t0 + req.timeout, req.output_limit, early)
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

    def _open_marked(self, argv: list[str], cwd: str, env: Mapping[str, str], token: str) -> Stream:
        """An exec with stdin attached; its hijacked socket relayed to two pipes (``_DockerStream``)."""
        try:
            eid = self._api.exec_create(self.container_id, argv, stdout=True, stderr=True, stdin=True,
                                        environment=[f"{k}={v}" for k, v in env.items()], workdir=cwd)["Id"]
            sock = self._api.exec_start(eid, socket=True)
        except _api_errors() as e:
            raise self._gone(e, "exec failed") from e
        raw: socket.socket = getattr(sock, "_sock", sock)
        early = _buffered_stream_bytes(sock, raw)
        raw.setblocking(True)  # and no timeout: a stream may be silent for long
        return _DockerStream(self, eid, sock, raw, token, early)

    def _running(self) -> bool:
        """The engine's record: does the container run? (False also when the engine does not know it.)"""
        try:
            return bool(self._api.inspect_container(self.container_id)["State"].get("Running"))
        except _api_errors():
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
            except _api_errors() as e:
                raise self._gone(e, "exec inspect failed") from e
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                raise SubstrateError(
                    f"docker: sandbox {self.id}: exec ended but reports no exit code"
                )
            time.sleep(0.005)

    def _kill(self, token: str) -> None:
        """Kill every process of the exec that carries ``token`` (and their sessions)."""
        try:
            eid = self._api.exec_create(
                self.container_id,
                C.kill_argv(token),
                stdout=True,
                stderr=True,
                environment=[f"PATH={SANDBOX_PATH}"],
            )["Id"]
            self._api.exec_start(eid)
        except _api_errors() as e:
            raise self._gone(e, "cannot kill a timed-out command") from e

    # -- files ----------------------------------------------------------------------------------
    def _put(self, files: Mapping[str, bytes]) -> None:
        self._check()
        try:
            self._api.put_archive(self.container_id, "/", C.files_tar(files))
        except _api_errors() as e:
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
            except _api_errors() as e:
                raise self._gone(e, f"cannot read {path}") from e
            try:
                with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
                    member = tar.next()
                    if member is None:
                        raise FileNotFoundError(path)
                    if member.issym():
                        path = C.check_path(posixpath_join(path, member.linkname))
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

    # -- destroy ------------------------------------------------------------------------------
    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        C.unbind_disk(self.run_id, self.id)  # the disk bound's tmpfs first
        try:
            self._api.remove_container(self.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except _api_errors() as first:
            # A daemon that refuses to remove a paused container: unpause it, then remove.
            try:
                with contextlib.suppress(docker.errors.APIError):
                    self._api.unpause(self.container_id)
                self._api.remove_container(self.container_id, force=True)
            except docker.errors.NotFound:
                pass
            except _api_errors() as e:
                # e.g. dockerd down (killed, restarting): the substrate tries again when it closes
                self._unremoved[self.container_id] = self.id
                raise self._gone(e, f"cannot remove the container ({first})") from e

    # -- gate-side evidence ----------------------------------------------------------------------
    def _inspect_state(self, wait: float) -> Mapping[str, Any] | str:
        wait = max(wait, 10.0)  # the daemon's own answer; a loaded host is slow, not absent
        try:
            resp = self._api._get(self._api._url("/containers/{0}/json", self.container_id), timeout=wait)
            return self._api._result(resp, True).get("State") or {}
        except docker.errors.NotFound:
            return f"docker: the container {self.container_id[:12]} is gone (the daemon does not know it)"
        except _api_errors() as e:
            return f"docker: the daemon did not answer an inspect of the container within {wait:g} s: {e}"

    # -- host-side freeze (fault injection only) -------------------------------------------------
    def freeze(self) -> None:
        """``docker pause``: the cgroup freezer stops every process of the container."""
        self._check()
        try:
            self._api.pause(self.container_id)
        except _api_errors() as e:
            raise self._gone(e, "cannot pause the container") from e

    def thaw(self) -> None:
        if self._destroyed:
            return
        try:
            self._api.unpause(self.container_id)
        except docker.errors.APIError as e:
            if "is not paused" in str(e).lower():  # 409 or 500, depending on the daemon
                return  # idempotent
            raise self._gone(e, "cannot unpause the container") from e
        except _api_errors() as e:
            raise self._gone(e, "cannot unpause the container") from e


def posixpath_join(path: str, target: str) -> str:
    return target if target.startswith("/") else posixpath.join(posixpath.dirname(path), target)


class _ChunkReader(io.RawIOBase):
    """A file object over the SDK's chunk iterator (for ``tarfile`` in stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _buffered_stream_bytes(sock: Any, raw: socket.socket) -> bytes:
    """The start of the exec's stream that ``http.client`` already read past the ``101 UPGRADED``
    headers into its buffer. The SDK hands out the socket *under* that buffer, so without this a
    command whose output arrives before the client parsed the headers (a busy client: other
    threads hold the GIL) loses it whole: it exits 0 with empty output."""
    try:
        fp = sock._response.raw._fp.fp
    except AttributeError:
        return b""
    if fp is None:
        return b""
    raw.setblocking(False)  # peek: what is buffered, or one read that does not wait
    try:
        data = fp.peek(1 << 16)
        return fp.read(len(data)) if data else b""
    except (OSError, ValueError):
        return b""


def _take_frames(pending: bytearray) -> Iterator[tuple[int, bytes]]:
    """(stream, payload) of each whole frame at the start of ``pending`` (removed from it); stream 2
    is stderr, 1 stdout."""
    while len(pending) >= _HEADER.size:
        kind, size = _HEADER.unpack_from(pending)
        if len(pending) < _HEADER.size + size:
            return
        payload = bytes(pending[_HEADER.size : _HEADER.size + size])
        del pending[: _HEADER.size + size]
        yield kind, payload


class _DockerStream(PipeStream):
    """A ``Stream`` over an exec's hijacked socket: two daemon threads relay it to pipes. One demuxes
    the frames, stdout into the stdout pipe (stderr dropped) until the exec's stream ends; the other
    sends what the stdin pipe gives to the socket, and half-closes the socket's write side when the
    caller closes its stdin end. Each thread closes its own pipe end when it is done."""

    def __init__(self, box: DockerSandbox, eid: str, sock: Any, raw: socket.socket, token: str, early: bytes) -> None:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        super().__init__(in_w, out_r)
        self._box = box
        self._eid = eid
        self._sock = sock
        self._raw = raw
        self._token = token
        self._threads = [
            threading.Thread(target=self._relay_out, args=(early, out_w), name=f"stream-out-{eid[:8]}", daemon=True),
            threading.Thread(target=self._relay_in, args=(in_r,), name=f"stream-in-{eid[:8]}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _relay_out(self, early: bytes, out_w: int) -> None:
        pending = bytearray(early)
        try:
            while True:
                for kind, payload in _take_frames(pending):
                    if kind != 2:
                        _write_all(out_w, payload)
                chunk = self._raw.recv(1 << 16)
                if not chunk:
                    return
                pending += chunk
        except OSError:  # the socket shut (``close``), or the caller closed its read end
            return
        finally:
            os.close(out_w)

    def _relay_in(self, in_r: int) -> None:
        poller = select.poll()
        poller.register(in_r, select.POLLIN)
        poller.register(self._raw, select.POLLRDHUP)  # the exec's stream ended: stop reading stdin
        try:
            while True:
                for fd, _ in poller.poll():
                    if fd != in_r:
                        return
                    data = os.read(in_r, 1 << 16)
                    if not data:
                        self._raw.shutdown(socket.SHUT_WR)
                        return
                    self._raw.sendall(data)
        except OSError:
            return
        finally:
            os.close(in_r)

    def _status(self) -> int | None:
        try:
            info = self._box._api.exec_inspect(self._eid)
        except docker.errors.NotFound:
            return -signal.SIGKILL  # the container is gone, and the exec with it
        except _api_errors():
            return None
        if info.get("Running") or info.get("ExitCode") is None:
            return None
        return int(info["ExitCode"])

    def _kill(self, timeout: float) -> None:
        with contextlib.suppress(SubstrateError):
            self._box._kill(self._token)

    def _reap(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            self._sock.close()
        while True:
            code = self._status()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.01)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_frames(
    raw: socket.socket, deadline: float, limit: int, early: bytes = b""
) -> tuple[bytes, bytes, list[int], bool]:
    """Read Docker's multiplexed stream to EOF or ``deadline``; keep ``limit`` bytes per stream
    (head and tail, as ``hostproc.HeadTail``). ``early``: the stream's first bytes, read already."""
    keep = [HeadTail(limit), HeadTail(limit)]
    pending = bytearray()
    raw.setblocking(False)
    poller = select.poll()  # not select(): descriptors above 1024 are common at high concurrency
    poller.register(raw, select.POLLIN)
    try:
        chunk = early
        while True:
            if chunk:
                pending += chunk
                for kind, payload in _take_frames(pending):
                    keep[1 if kind == 2 else 0].add(payload)
                chunk = b""
            wait = deadline - time.monotonic()
            if wait <= 0:
                return keep[0].value(), keep[1].value(), [keep[0].total, keep[1].total], True
            if not poller.poll(max(1, int(wait * 1000))):
                continue
            try:
                chunk = raw.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return keep[0].value(), keep[1].value(), [keep[0].total, keep[1].total], False
    finally:
        with contextlib.suppress(OSError):
            raw.setblocking(True)


class DockerSubstrate(C.ContainerSubstrate):
    name = "docker"
    sandbox_class = DockerSandbox
    capabilities = Capabilities(
        isolation=Isolation.CONTAINER,
        reset_strategies=(ResetStrategy.IN_PLACE, ResetStrategy.RECREATE),
        snapshot=False,
        network=False,
        notes="Docker containers via the Python SDK; network_mode=none; pids and memory limits",
    )

    def __init__(self, run_id: str, state_dir: Path) -> None:
        super().__init__(run_id, state_dir)
        self.client = _client()
        self._quota: tuple[str | None] | None = None  # (why the storage takes no size,) once asked
        self._disk: tuple[str, str] | None = None
        # container id -> sandbox id of this instance's containers whose removal failed (``close``
        # removes them: a daemon that was down may answer again by then)
        self.unremoved: dict[str, str] = {}

    def disk_quota(self) -> str | None:
        """None when dockerd's storage takes a per-container size, else why not (asked once)."""
        if self._quota is None:
            try:
                info = self.client.info()
                status = dict((k, v) for k, v in info.get("DriverStatus") or [])
                self._quota = (C.storage_quota("docker", str(info.get("Driver", "")),
                                               str(status.get("Backing Filesystem", ""))),)
            except _api_errors() as e:
                self._quota = (f"docker info failed: {e}",)
        return self._quota[0]

    def disk_tmpfs(self) -> str | None:
        """None when the disk bound can be a tmpfs over the container's overlay2 layer folder (root,
        overlay2, dockerd in this mount namespace), else why not."""
        if os.geteuid() != 0:
            return "needs root (a tmpfs over the container's layer folder)"
        errors: tuple[type[BaseException], ...] = (IndexError, ValueError, subprocess.SubprocessError, *_api_errors())
        try:
            info = self.client.info()
            pidof = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, timeout=10)
            pid = int(pidof.stdout.split()[0])
            same_ns = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        except errors as e:
            return f"cannot tell dockerd's storage or mount namespace: {e}"
        if info.get("Driver") != "overlay2":
            return f"docker's storage driver is {info.get('Driver')}, not overlay2"
        if not same_ns:
            return "dockerd runs in another mount namespace"
        return None

    def disk_mode(self) -> tuple[str, str]:
        """("quota" | "tmpfs" | "none", the mechanism's text), decided once."""
        if self._disk is None:
            lim = self.limits.disk_bound_mb
            quota = self.disk_quota()
            tmpfs = None if quota is None else self.disk_tmpfs()
            if quota is None:
                self._disk = ("quota", f"{lim} MiB: --storage-opt size (the storage's per-container quota)")
            elif tmpfs is None:
                self._disk = ("tmpfs", f"{lim} MiB: a tmpfs of that size over the container's overlay2 layer "
                                       "folder (its upper and work), mounted before it starts; ENOSPC inside it; "
                                       f"its pages count against the memory bound too ({quota})")
            else:
                self._disk = ("none", f"not enforced: {quota}, and no tmpfs: {tmpfs}; a sandbox's writes go to "
                                      "the host's file system unbounded")
        return self._disk

    def limit_mechanisms(self) -> dict[str, str]:
        return C.limit_mechanisms(self.limits, self.disk_mode()[1])

    @classmethod
    def missing(cls) -> str | None:
        if not HAVE_SDK:
            return (
                "docker: the Python SDK is missing: pip install 'drumsbench[docker]' "
                "(or run scripts/setup.sh)"
            )
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            client = docker.from_env(version="auto", timeout=5)
            client.ping()
        except Exception:
            return f"docker: the daemon does not answer at {where}: {SOCKET_HINT}"
        try:
            if not image_exists(client, C.sandbox_tag()) and not C.rootfs_tar_cached():
                import shutil

                if shutil.which("debootstrap") is None:
                    return (
                        "docker: the image is absent and debootstrap is missing to build it: "
                        "run scripts/setup.sh"
                    )
        finally:
            client.close()
        return None

    def build_image(self) -> str:
        return ensure_image(flavor=self.flavor)

    def create(self) -> DockerSandbox:
        image = self.image()
        sid = C.new_sandbox_id()
        api = self.client.api
        try:
            cid = api.create_container(
                image,
                command=C.REAPER_ARGV,
                working_dir=C.PATHS.work,
                labels={C.LABEL_RUN: self.run_id, C.LABEL_SANDBOX: sid},
                host_config=api.create_host_config(**self._host_config()),
            )["Id"]
        except _api_errors() as e:
            raise SubstrateError(f"docker: cannot create a container of {image}: {e}") from e
        errors: tuple[type[BaseException], ...] = (SubstrateError, *_api_errors())
        try:
            self._bound_disk(cid, sid)
            api.start(cid)
        except errors as e:
            C.unbind_disk(self.run_id, sid)
            with contextlib.suppress(*_api_errors()):
                api.remove_container(cid, force=True)
            if isinstance(e, SubstrateError):
                raise
            raise SubstrateError(f"docker: cannot start container {cid[:12]}: {e}") from e
        return DockerSandbox(self, cid, sid).handed_over()

    def _host_config(self) -> dict[str, Any]:
        """The container's limits (``self.limits``), no network, no new privileges."""
        lim = self.limits
        cfg: dict[str, Any] = {"network_mode": "none", "security_opt": ["no-new-privileges"],
                               "pids_limit": lim.pids if lim.pids is not None else -1}
        if lim.memory_mb is not None:
            cfg["mem_limit"] = f"{lim.memory_mb}m"
        if lim.disk_bound_mb is not None and self.disk_mode()[0] == "quota":
            cfg["storage_opt"] = {"size": f"{lim.disk_bound_mb}m"}
        return cfg

    def _bound_disk(self, cid: str, sid: str) -> None:
        """The tmpfs disk bound over the created (not started) container's layer folder."""
        if self.limits.disk_bound_mb is None or self.disk_mode()[0] != "tmpfs":
            return
        errors: tuple[type[BaseException], ...] = (KeyError, TypeError, *_api_errors())
        try:
            data = self.client.api.inspect_container(cid)["GraphDriver"]["Data"]
            upper, work = Path(data["UpperDir"]), Path(data["WorkDir"])
        except errors as e:
            raise SubstrateError(f"docker: cannot find the layer folder of {cid[:12]}: {e}") from e
        C.bound_container_layer("docker", cid, upper, work, self.limits.disk_bound_mb, C.disk_source(self.run_id, sid))

    def _containers(self, label: str) -> list[dict[str, Any]]:
        return self.client.api.containers(all=True, filters={"label": label})

    def raw_floor(self) -> list[str] | None:
        """How most harnesses start a sandbox: the CLI, one container per command."""
        cli = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
        return [cli, "run", "--rm", "--network", "none", self.image(), "true"]

    def leftovers(self) -> list[str]:
        try:
            found = self._containers(f"{C.LABEL_RUN}={self.run_id}")
        except _api_errors() as e:
            return [f"docker: cannot list containers: {e}"]
        left = [f"container {c['Id'][:12]} ({c.get('State', '?')})" for c in found]
        # a disk-bound tmpfs goes with its container; one left without containers is a leftover itself
        return left or [f"mount {p}" for p in mounts_of_source(C.disk_source(self.run_id))]

    def close(self, wait_s: float = 60.0) -> None:
        """Remove the containers whose ``destroy`` failed (waiting up to ``wait_s`` for a daemon that
        does not answer), then close the client. What still cannot be removed stays for ``gc``."""
        deadline = time.monotonic() + wait_s
        while self.unremoved and time.monotonic() < deadline:
            for cid, sid in list(self.unremoved.items()):
                C.unbind_disk(self.run_id, sid)
                try:
                    self.client.api.remove_container(cid, force=True)
                except docker.errors.NotFound:
                    pass
                except _api_errors():
                    continue
                del self.unremoved[cid]
            if self.unremoved:
                time.sleep(1.0)
        with contextlib.suppress(Exception):
            self.client.close()

    @classmethod
    def gc(cls, state_dir: Path, dead_runs: set[str]) -> list[str]:
        if not HAVE_SDK or not dead_runs:
            return []
        try:
            client = docker.from_env(version="auto", timeout=30)
            found = client.api.containers(all=True, filters={"label": C.LABEL_RUN})
        except Exception:
            return []
        def remove(cid: str) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(cid, force=True)

        def builds() -> list[str]:
            return [c["Id"] for c in client.api.containers(all=True, filters={"name": C.BUILD_PREFIX})
                    if any(n.lstrip("/").startswith(C.BUILD_PREFIX) for n in c["Names"])]

        removed: list[str] = []
        for run in dead_runs:  # disk-bound tmpfs first (detached; freed as their containers go, one line each)
            C.unbind_disk(run)
        try:
            C.gc_containers("docker", found, dead_runs, remove, builds, removed)
        except _api_errors():
            pass
        finally:
            client.close()
        return removed


def main(argv: list[str] | None = None) -> int:
    return C.engine_main(DockerSubstrate, lambda flavor: ensure_image(flavor=flavor), argv)


if __name__ == "__main__":
    sys.exit(main())
