"""Harbor's own interpreter, called as a separate process (Harbor needs Python >= 3.12 and ~120
packages DrumsBench never imports; ``scripts/setup-harbor.sh`` installs the pinned version).

Contract: ``harbor_python()`` is the interpreter (``$DRUMSBENCH_HARBOR_PYTHON``, else
``.venv-harbor/bin/python`` beside the virtual environment DrumsBench runs in), or None;
``missing()`` says why it cannot be used, or None. ``parse(folders)`` hands the folders to
``harbor_side.py`` under ``python -I`` (no user site, no ``PYTHONPATH``) and returns its answers
in order (see that module); a missing interpreter is a ``UsageError`` naming the set-up command, an
interpreter that fails or answers nonsense an ``DrumsError`` (the tool's own parts, not the task).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from drumsbench.core.errors import DrumsError, UsageError

HARBOR_VERSION = "0.26.0"  # what scripts/setup-harbor.sh pins
SIDE = Path(__file__).with_name("harbor_side.py")
TIMEOUT_S = 120.0


def harbor_python() -> Path | None:
    """The interpreter with ``harbor`` (module contract)."""
    given = os.environ.get("DRUMSBENCH_HARBOR_PYTHON")
    if given:
        return Path(given)
    beside = Path(sys.prefix).parent / ".venv-harbor" / "bin" / "python"
    return beside if beside.exists() else None


def missing() -> str | None:
    """Why Harbor's interpreter cannot be used here, or None."""
    py = harbor_python()
    if py is None:
        return ("Harbor is not installed beside DrumsBench: run scripts/setup-harbor.sh "
                "(or set DRUMSBENCH_HARBOR_PYTHON)")
    if not os.access(py, os.X_OK):
        return f"DRUMSBENCH_HARBOR_PYTHON: {py} is not an executable interpreter; run scripts/setup-harbor.sh"
    return None


def parse(folders: list[Path]) -> list[dict[str, Any]]:
    """Harbor's reading of each task folder, in order (module contract)."""
    why = missing()
    if why is not None:
        raise UsageError(f"--tasks harbor: {why}")
    py = harbor_python()
    assert py is not None  # missing() said so
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LANG": "C.UTF-8"}  # litellm offline, nothing else inherited
    try:
        proc = subprocess.run([str(py), "-I", str(SIDE)], input=json.dumps([str(f) for f in folders]).encode(),
                              capture_output=True, env=env, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DrumsError(f"harbor: {py} did not answer ({e})") from None
    tail = " ".join(proc.stderr.decode(errors="replace").split())[-300:]
    if proc.returncode != 0:
        raise DrumsError(f"harbor: {py} exited {proc.returncode}: {tail}")
    try:
        answers = json.loads(proc.stdout)
    except ValueError:
        raise DrumsError(f"harbor: {py} printed no JSON answer: {tail}") from None
    if not isinstance(answers, list) or len(answers) != len(folders) or not all(isinstance(a, dict) for a in answers):
        raise DrumsError(f"harbor: {py} answered {len(answers) if isinstance(answers, list) else 'not a list'} "
                       f"entries for {len(folders)} folders")
    return answers
