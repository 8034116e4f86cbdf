"""Nothing of a desktop CRIU branch stays in the host's /tmp: the checkpointable parent (no mount
namespace of its own) keeps its X socket and LibreOffice's pipes there while it runs; they go with it."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from drumsbench.experiments.branch import BranchConfig, run_branch
from drumsbench.ledger import Ledger
from drumsbench.substrates.process import ProcessSubstrate

# What a desktop instance could leave in the host's /tmp. The host is shared (other processes make
# and remove their own entries meanwhile), so new entries are judged by these names and by type.
DESKTOP_NAMES = ("OSL_PIPE", ".X", ".ICE", "lu", "criu", "drumsbench", "soffice", "xkb")


def _entries() -> dict[str, int]:
    out = {}
    for p in Path("/tmp").iterdir():
        try:
            out[p.name] = p.lstat().st_mode
        except OSError:
            continue
    return out


def test_desktop_single_office_pipe_name():
    from drumsbench.envs.desktop.instance import single_office_pipe

    # as LibreOffice 7 named it for this profile URL (bytes below 0x10 lose their leading zero)
    assert single_office_pipe(0, "file:///work/scratch/leaks/prof") == \
        "OSL_PIPE_0_SingleOfficeIPC_e289d4ce64f071cc885ff81107bec"


def test_criu_branch_leaves_nothing_in_host_tmp(tmp_path):
    from drumsbench.branching import criu_binary as criu_install
    from drumsbench.envs.desktop import instance

    from conftest import require

    require(instance.missing())
    require(criu_install.missing())
    state = tmp_path / "state"
    state.mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.create_run("bt", "branch", {}, {}, "test")
    # another X server's socket in the host's /tmp/.X11-unix: the folder is in use, and the run (which
    # removes the folder once no instance of its own uses it, if empty) must leave it and the socket
    x11 = Path("/tmp/.X11-unix")
    made_x11 = not x11.is_dir()
    if made_x11:
        x11.mkdir(mode=0o1777)
    other = socket.socket(socket.AF_UNIX)
    other_path = x11 / f"X-drumsbench-test-{os.getpid()}"
    other.bind(str(other_path))
    try:
        before = _entries()
        cfg = BranchConfig(tasks="desktop", k=2, ks=[], continuations=1, methods=["criu"])
        sub = ProcessSubstrate("bt", state)
        try:
            report = run_branch(cfg, sub, ledger, "bt")
        finally:
            sub.close()
        (m,) = report.methods
        assert m.method == "criu" and m.valid == 1, m
        after = _entries()
        new = sorted(n for n, mode in after.items() if n not in before
                     and (n.startswith(DESKTOP_NAMES) or stat.S_ISSOCK(mode)))
        assert new == [], f"left in the host's /tmp: {new}"
        assert stat.S_ISSOCK(os.lstat(other_path).st_mode), "a folder another X server uses lost its socket"
    finally:
        other.close()
        other_path.unlink(missing_ok=True)
        if made_x11:
            with contextlib.suppress(OSError):
                x11.rmdir()
