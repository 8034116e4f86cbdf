"""The podman CLI as the ``podman`` substrate runs it: a **project-private configuration**
(``configure``: ``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF`` files under
``images.cache_dir()/podman/``, see the ``podman`` module), ``podman(ARGS)`` with it, and the same
with CRIU on podman's PATH for container checkpoints (``with_criu``; their folder, ``checkpoint_dir``).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.containers import common as C

RUNTIME_DIR = Path("/dev/shm/drumsbench-podman")


def config_dir() -> Path:
    return images.cache_dir() / "podman"


def work_dir() -> Path:
    """The working folder of every podman process (and so of its conmon): conmon writes an ``oom``
    marker into its working folder when a container's process is OOM-killed, which must not be the
    harness's (the host's) working folder."""
    return config_dir() / "cwd"


def _limit(res: int, want: int) -> int:
    hard = resource.getrlimit(res)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def config_files() -> dict[str, str]:
    """File name -> content of the private podman configuration for this host."""
    nofile = _limit(resource.RLIMIT_NOFILE, 20000)
    nproc = _limit(resource.RLIMIT_NPROC, 32768)
    runtime = shutil.which("runc") or "runc"
    containers_conf = f"""\
# Written by drumsbench.substrates.containers.podman.configure(); do not edit (it is rewritten).
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
log_driver = "k8s-file"
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "{RUNTIME_DIR}/libpod"

[engine.runtimes]
runc = ["{runtime}"]
"""
    storage_conf = f"""\
# Written by drumsbench.substrates.containers.podman.configure(); do not edit (it is rewritten).
[storage]
driver = "overlay"
graphroot = "{config_dir() / "storage"}"
runroot = "{RUNTIME_DIR}/storage"

[storage.options.overlay]
# never bind the storage's overlay folder over itself: podman binds it (not recursively) when a
# command starts and detaches it when one ends with no container running, so a disk-bound tmpfs
# mounted over a container's layer folder between create and start would be shadowed by the next
# command's bind (and its layer folder left undeletable)
skip_mount_home = "true"
"""
    return {"containers.conf": containers_conf, "storage.conf": storage_conf}


_configured: dict[str, str] | None = None
_configure_lock = threading.Lock()


def configure() -> dict[str, str]:
    """Write the private configuration when it differs; the environment that selects it."""
    global _configured
    with _configure_lock:
        if _configured is not None:
            return _configured
        folder = config_dir()
        folder.mkdir(parents=True, exist_ok=True)
        work_dir().mkdir(exist_ok=True)
        for name, content in config_files().items():
            path = folder / name
            try:
                current = path.read_text()
            except OSError:
                current = None
            if current != content:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(content)
                tmp.rename(path)
        env = dict(os.environ)
        env.update(
            CONTAINERS_CONF=str(folder / "containers.conf"),
            CONTAINERS_STORAGE_CONF=str(folder / "storage.conf"),
            PODMAN_IGNORE_CGROUPSV1_WARNING="1",
        )
        _configured = env
        return env


def podman(
    args: Sequence[str], *, check: bool = True, timeout: float = 120, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``podman --log-level=error ARGS`` with the private configuration."""
    exe = shutil.which("podman")
    if exe is None:
        raise SubstrateError(
            "podman: not installed: apt-get install podman (or run scripts/setup.sh)"
        )
    try:
        proc = subprocess.run(
            [exe, "--log-level=error", *args],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env=configure(),
            cwd=work_dir(),
        )
    except subprocess.TimeoutExpired as e:
        raise SubstrateError(f"podman {args[0]}: no answer within {timeout:.0f} s") from e
    if check and proc.returncode != 0:
        raise SubstrateError(
            f"podman {args[0]} failed (exit {proc.returncode}): {C.decode_tail(proc.stderr)}"
        )
    return proc


def checkpoint_dir(state_dir: Path, run_id: str) -> Path:
    """Where a run keeps its exported container checkpoints (removed by ``drop_checkpoint``, and by
    ``gc`` for a dead run)."""
    return state_dir / "podman-checkpoints" / run_id


def criu_env() -> dict[str, str]:
    """podman's environment with CRIU (>= 4, ``core.criu_binary``) first on PATH: runc runs ``criu``."""
    from drumsbench.core import criu_binary

    path = criu_binary.criu_path()
    if path is None:
        raise SubstrateError(f"podman: container checkpoints need CRIU: {criu_binary.missing()}")
    env = dict(configure())
    env["PATH"] = f"{os.path.dirname(path)}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


def with_criu(exe: str, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[bytes] | None:
    """``podman --log-level=error ARGS`` with CRIU on its PATH (``criu_env``); None when it did not
    end within ``timeout`` (s)."""
    try:
        return subprocess.run([exe, "--log-level=error", *args], capture_output=True, timeout=timeout,
                              env=criu_env(), cwd=work_dir())
    except subprocess.TimeoutExpired:
        return None


def criu_errors(stderr: bytes) -> str:
    """The ``Error`` lines of the CRIU log that podman's message names (read before the container,
    and the log with it, may go)."""
    m = re.search(rb"log file: (\S+?\.log)", stderr)
    if not m:
        return ""
    try:
        lines = Path(m.group(1).decode()).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.split(": ", 1)[-1] for line in lines if "Error (" in line and "RLIMIT_NOFILE" not in line]
    return "CRIU: " + "; ".join(errors[:4]) if errors else ""
