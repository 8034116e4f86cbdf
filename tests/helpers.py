"""Helpers shared by tests: build a rollout slot on a real substrate, run the CLI as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from drumsbench.envs.coding.env import CodingEnv
from drumsbench.rollout.attempt import Slot
from drumsbench.substrates import registry

ROOT = Path(__file__).resolve().parents[1]
MINI = str(ROOT / "tests" / "data" / "mini")


def one_task_suite(tmp_path: Path, task_id: str = "textstats-empty-summary") -> Path:
    """A suite folder in ``tmp_path`` holding one built-in coding task and its project (to damage)."""
    import tomllib

    from drumsbench.envs.suite_folders import BUILTIN_ROOT

    builtin = BUILTIN_ROOT / "coding"
    suite = tmp_path / "suite"
    shutil.copytree(builtin / task_id, suite / task_id)
    name = tomllib.loads((builtin / task_id / "task.toml").read_text())["project"]
    shutil.copytree(builtin / "projects" / name, suite / "projects" / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return suite


def slot_on(name: str, run_id: str, state_dir: Path) -> Slot:
    return Slot(registry.get(name)(run_id, state_dir), CodingEnv())


def slots_on(name: str, run_id: str, state_dir: Path, workers: int) -> list[Slot]:
    """``workers`` slots of one substrate of ``name``, as the harness's workers share it."""
    first = slot_on(name, run_id, state_dir)
    return [first] + [Slot(first.substrate, CodingEnv(), worker=w) for w in range(1, workers)]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600, check: bool = False,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``drumsbench ARGS`` in a subprocess, exactly as a user would."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "drumsbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"drumsbench {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


# -- headless Chromium ---------------------------------------------------------------------------------

def chromium_missing() -> str | None:
    if shutil.which("chromium") is None:
        return "chromium is not installed (bash scripts/setup-report.sh installs Debian's chromium)"
    return None


def _netns_prefix() -> list[str]:
    try:
        ok = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ["unshare", "-n"] if ok else []


def chromium(url: str, work: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url`` with a fresh profile; nothing it tries can leave the machine."""
    profile = work / f"profile-{len(list(work.glob('profile-*')))}"
    profile.mkdir(parents=True)
    cmd = [*_netns_prefix(), "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           "--hide-scrollbars", "--force-device-scale-factor=1", *extra, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    shutil.rmtree(profile, ignore_errors=True)
    return proc
