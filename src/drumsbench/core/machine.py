"""What a number was measured on: the machine and the code's commit."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any


def _first(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_info() -> dict[str, Any]:
    mem_kib = _first("/proc/meminfo", "MemTotal").split()[0]
    try:
        debian = Path("/etc/debian_version").read_text().strip()
    except OSError:
        debian = "not debian"
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count() or 1,
        "memory_gib": round(int(mem_kib) / 1024 / 1024, 1) if mem_kib.isdigit() else None,
        "kernel": platform.release(),
        "os": f"Debian {debian}",
        "python": platform.python_version(),
    }


def commit() -> str:
    """``<sha>`` of the DrumsBench source tree, ``<sha>+dirty`` with local changes, or ``unknown``."""
    src = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "."],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha[:12] + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
