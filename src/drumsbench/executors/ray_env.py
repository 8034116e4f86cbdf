"""Settings that keep every byte of Ray on loopback (see docs/ray.md).

On the project's machines Ray's defaults bind to and advertise the machine's external address,
probe cloud metadata over HTTP and DNS, and post a usage report to a public host. Every process
that starts or joins Ray (driver, nodes, tests) must carry the settings below *before* it starts
or joins Ray; child processes (raylets, workers) inherit them from the process environment.

This module does not import Ray.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from drumsbench.core.host_state import alive

LOOPBACK = "127.0.0.1"

# Forced: without them Ray sends traffic off the machine.
LOOPBACK_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # else Ray rewrites 127.0.0.1 to the primary address
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    # metadata probes go to a dead loopback proxy: no DNS, no TCP out. Upper case only: gRPC
    # reads the lower-case names, which must stay unset.
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost,::1",
    "RAY_AUTH_MODE": "token",
}
LOWERCASE_PROXIES = ("http_proxy", "https_proxy", "grpc_proxy", "no_proxy", "all_proxy")

# Ray's own settings for nodes this process starts: no dashboard, a capped object store.
NODE_KWARGS: dict[str, object] = {"include_dashboard": False}
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass
class RayEnv:
    """The environment one process applied; ``restore()`` puts the previous values back."""

    folder: Path | None  # our own folder (token + Ray temp dir), removed by ``restore``
    token_path: str
    tmpdir: str
    _saved: dict[str, str | None] = field(default_factory=dict)

    def restore(self, remove_folder: bool = True) -> None:
        """Put the saved variables back; with ``remove_folder``, remove our own folder for good.

        See ``remove``.
        """
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = {}
        if remove_folder and self.folder is not None:
            remove(self.folder, self.tmpdir)


def apply(folder: Path | None = None, *, new_token: bool = True) -> RayEnv:
    """Set the loopback settings in ``os.environ`` for this process and its children.

    ``RAY_AUTH_TOKEN_PATH`` and ``RAY_TMPDIR`` are kept when already set (the operator's cluster,
    whose token every joining process must share); otherwise they point into ``folder`` (a new
    short folder under /tmp when not given, short because Ray's unix socket paths live there),
    with a fresh token when ``new_token`` (a cluster of our own) .
    """
    saved: dict[str, str | None] = {}

    def put(key: str, value: str | None) -> None:
        saved.setdefault(key, os.environ.get(key))
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

    for key, value in LOOPBACK_ENV.items():
        put(key, value)
    for key in LOWERCASE_PROXIES:
        if key in os.environ:
            put(key, None)

    _remove_returned()
    own: Path | None = None
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    tmpdir = os.environ.get("RAY_TMPDIR")
    if token_path is None or tmpdir is None:
        own = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="dray-", dir=short_tmp()))
        own.mkdir(parents=True, exist_ok=True, mode=0o700)
    if tmpdir is None:
        assert own is not None
        tmpdir = str(own / "t")
        Path(tmpdir).mkdir(exist_ok=True)
        put("RAY_TMPDIR", tmpdir)
    if token_path is None:
        assert own is not None
        token_file = own / "auth_token"
        if new_token and not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        token_path = str(token_file)
        put("RAY_AUTH_TOKEN_PATH", token_path)
    return RayEnv(folder=own, token_path=token_path, tmpdir=tmpdir, _saved=saved)


def processes_with_tmpdir(tmpdir: str) -> list[int]:
    """Pids whose environment has ``RAY_TMPDIR=tmpdir`` (one Ray's processes), not this one."""
    needle = f"RAY_TMPDIR={tmpdir}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def reap(tmpdir: str, grace_s: float = 10.0) -> list[int]:
    """Stop what is left of one Ray's processes: SIGTERM, SIGKILL after ``grace_s``; returns their pids."""
    left = processes_with_tmpdir(tmpdir)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in left):
        time.sleep(0.2)
    for pid in left:
        if alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return left


# Folders of this process's own Ray environments already removed (``remove``): Ray may write into a
# past session's folder after its shutdown (seen: a folder removed at the end of one test module
# came back while the next module started its own Ray in the same process). Each later ``apply`` and
# ``remove``, and the exit of this process, removes any of them that came back.
_REMOVED: list[Path] = []
_AT_EXIT = False


def _remove_returned() -> None:
    for old in _REMOVED:
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)


def remove(folder: Path, tmpdir: str) -> list[int]:
    """Remove one Ray's own folder for good; returns the pids of its processes that had to be stopped.

    Ray's helper processes (agents, log monitor) may outlive ``ray.shutdown()`` by seconds and
    recreate their session folder under a removed one: every process that still carries
    ``RAY_TMPDIR=tmpdir`` is stopped first (``reap``), and the removal is repeated if the folder
    came back meanwhile.
    """
    global _AT_EXIT
    stopped: list[int] = []
    for _ in range(3):
        stopped += reap(tmpdir)
        shutil.rmtree(folder, ignore_errors=True)
        time.sleep(0.2)
        if not folder.exists():
            break
    if folder not in _REMOVED:
        _REMOVED.append(folder)
    _remove_returned()
    if not _AT_EXIT:  # registered after Ray's own exit handler, so it runs after it
        atexit.register(_remove_returned)
        _AT_EXIT = True
    return stopped


SOCKET_ROOM = 30  # Ray's unix sockets go 70 characters below RAY_TMPDIR's parent; sun_path holds 107


def short_tmp() -> str:
    """The temp folder (``TMPDIR``) when it is short enough for Ray's unix socket paths, else /tmp."""
    base = tempfile.gettempdir()
    return base if len(base) <= SOCKET_ROOM else "/tmp"


def is_loopback_address(address: str | None) -> bool:
    """True for no address, ``auto``, or HOST:PORT whose host is a loopback name."""
    if address in (None, "", "auto", "local"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if "://" in host:
        host = host.split("://", 1)[1]
    return host in ("localhost", "::1") or host.startswith("127.")


def health_check_config(fast: bool) -> dict[str, int]:
    """``_system_config`` that marks a lost node dead in about a second instead of ~13 s."""
    if not fast:
        return {}
    return {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
            "health_check_failure_threshold": 2, "health_check_initial_delay_ms": 0}


def reload_auth() -> None:
    """Make an already imported Ray read the authentication settings again (after ``apply``)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
