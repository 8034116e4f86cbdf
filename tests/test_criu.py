"""CRIU live fork of a real process tree: every restored continuation resumes the exact memory state
of the parent and writes only to its own private copy of the files, at the same paths."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

import pytest

from drumsbench.core import criu_binary as criu_install
from drumsbench.core.criu import LiveTree, checkpoint, restore

from conftest import require

PROG = """
import os, time
n, secret = 0, os.urandom(8).hex()
while True:
    n += 1
    with open("state.txt.tmp", "w") as f:
        f.write(f"{n} {secret} {os.getpid()}\\n")
    os.replace("state.txt.tmp", "state.txt")
    time.sleep(0.05)
"""


def _read(path):
    for _ in range(100):
        try:
            n, secret, pid = path.read_text().split()
            return int(n), secret, int(pid)
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError(f"no state in {path}")


@pytest.fixture(scope="module")
def criu_ready():
    require(criu_install.missing())


def test_checkpoint_restore_many(tmp_path, criu_ready):
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "prog.py").write_text(PROG)
    tree = LiveTree.spawn([sys.executable, "prog.py"], cwd=str(env_dir), env={"PATH": os.environ["PATH"]})
    restored: list[int] = []
    try:
        time.sleep(0.5)
        n0, secret, pid_inside = _read(env_dir / "state.txt")
        assert pid_inside == 1  # the first process of its own pid namespace
        took = checkpoint(tree.pid, tmp_path / "images", {str(env_dir): str(tmp_path / "frozen")})
        assert took < 10
        for i in range(3):
            copy = tmp_path / f"copy{i}"
            shutil.copytree(tmp_path / "frozen", copy)
            (copy / "state.txt").write_text("0 none 0\n")
            restored.append(restore(tmp_path / "images", {str(env_dir): str(copy)}, tmp_path / f"pid{i}"))
        time.sleep(0.5)
        for i in range(3):
            n, s, _ = _read(tmp_path / f"copy{i}" / "state.txt")
            assert s == secret and n > n0 - 5, "a continuation must resume the parent's memory"
        n_parent, s_parent, _ = _read(env_dir / "state.txt")
        assert s_parent == secret and n_parent > n0  # the parent keeps running (--leave-running)
    finally:
        for pid in restored:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        tree.kill()
