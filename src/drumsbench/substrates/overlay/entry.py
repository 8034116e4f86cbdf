"""How an ``overlay`` sandbox's commands are entered: ``enter.c``, compiled on this host once per source.

Contract: ``argv(holder_pid, workdir, command)`` is the host command that runs ``command`` inside the
holder's namespaces and root, in ``workdir`` (inside), as uid 0 with ``SANDBOX_CAPS`` only, nothing
inheritable or ambient, and no_new_privs — and that execs **no program of the sandbox before those
privileges are dropped** (``nsenter -r ... env ... setpriv ...`` exec'd the sandbox's own ``env``
and ``setpriv`` as host root with every capability: a command that had replaced them ran its code
there). The helper is cached as ``images.cache_dir()/overlay-enter-<source hash>``; ``missing()``
says why it cannot be had.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from drumsbench import images
from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.bwrap import SANDBOX_CAPS

SOURCE = Path(__file__).with_name("enter.c")
CFLAGS = ("-static", "-O2", "-s", "-Wall", "-Werror")
# linux/capability.h numbers of the capabilities a sandbox's command keeps (bwrap.SANDBOX_CAPS)
CAP_NUMBER = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4, "kill": 5,
              "setgid": 6, "setuid": 7, "setpcap": 8, "net_bind_service": 10, "net_raw": 13,
              "sys_chroot": 18, "mknod": 27, "audit_write": 29, "setfcap": 31}
KEEP_MASK = sum(1 << CAP_NUMBER[c] for c in SANDBOX_CAPS)
_lock = threading.Lock()


def _path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:12]
    return images.cache_dir() / f"overlay-enter-{digest}"


def missing() -> str | None:
    """Why the helper cannot be had here (not built and no compiler), or None."""
    if _path().is_file() or shutil.which("gcc") or shutil.which("cc"):
        return None
    return "the overlay substrate compiles its entry helper: apt-get install gcc libc6-dev"


def binary() -> Path:
    """The compiled helper, built on first use (atomically: a concurrent build renames its own)."""
    out = _path()
    with _lock:
        if out.is_file():
            return out
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise SubstrateError(missing() or "no C compiler")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        res = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise SubstrateError(f"overlay: compiling {SOURCE.name} failed: {res.stderr.strip()[-400:]}")
        tmp.chmod(0o755)
        tmp.rename(out)
        return out


def argv(holder_pid: int, workdir: str, command: Sequence[str]) -> list[str]:
    """The host command that runs ``command`` in the sandbox of ``holder_pid`` (module contract)."""
    return [str(binary()), str(holder_pid), workdir, str(KEEP_MASK), "--", *command]
