"""Where CRIU (>= 4) is on this machine, and whether `criu check` passes.

``scripts/setup-criu.sh`` installs it: the distribution's package on Debian 13, Debian 13's
packages in a private folder run through their own loader on Debian 12 (whose criu 3.17 fails on
this kernel). ``DRUMSBENCH_CRIU`` overrides the path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

DEFAULT_HOME = "/opt/drumsbench/criu"
MIN_MAJOR = 4


def criu_path() -> str | None:
    for candidate in (os.environ.get("DRUMSBENCH_CRIU"), f"{DEFAULT_HOME}/criu", shutil.which("criu")):
        if candidate and os.access(candidate, os.X_OK) and (version(candidate) or (0,))[0] >= MIN_MAJOR:
            return candidate
    return None


def version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Version:\s*([\d.]+)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def missing() -> str | None:
    """None when a working CRIU >= 4 is here, else what is wrong and how to fix it."""
    path = criu_path()
    if path is None:
        return f"no CRIU >= {MIN_MAJOR} found: run scripts/setup-criu.sh (or scripts/setup.sh)"
    try:
        proc = subprocess.run([path, "check"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{path} check` did not run: {e}"
    if "Looks good" not in proc.stdout + proc.stderr:
        return f"`{path} check` fails: {(proc.stdout + proc.stderr).strip()[-200:]}"
    return None


def describe() -> str:
    path = criu_path()
    if path is None:
        return "missing"
    v = ".".join(map(str, version(path) or ()))
    problem = missing()
    return f"criu {v} at {path}: " + ("check passes" if problem is None else problem)
