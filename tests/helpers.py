"""Helpers shared by tests: build a rollout slot on a real substrate, run the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from drumsbench.envs.coding.env import CodingEnv
from drumsbench.rollout import Slot
from drumsbench.substrates import registry

ROOT = Path(__file__).resolve().parents[1]
MINI = str(ROOT / "tests" / "data" / "mini")


def slot_on(name: str, run_id: str, state_dir: Path) -> Slot:
    return Slot(registry.get(name)(run_id, state_dir), CodingEnv())


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600, check: bool = False,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``drumsbench ARGS`` in a subprocess, exactly as a user would."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "drumsbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"drumsbench {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc
