"""Every registered substrate passes the conformance suite (missing ones skip, or fail in CI)."""

from __future__ import annotations

import pytest

from drumsbench.substrates import registry
from drumsbench.substrates.conformance import CHECKS

from conftest import require


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", registry.names())
def test_conformance(name, check, state_dir, run_id):
    cls = registry.get(name)
    require(cls.missing())
    sub = cls(run_id, state_dir)
    try:
        check.run(sub)
    finally:
        sub.close()


@pytest.mark.parametrize("broken", ["missing", "no-op"])
def test_end_processes_check_catches_a_sandbox_that_cannot_end_its_processes(broken, state_dir, run_id,
                                                                             monkeypatch):
    """Positive control of ``check_end_processes``: the process substrate with the base class's
    ``end_processes`` (a plugin that never wrote one) or with one that kills nothing fails it."""
    from drumsbench.substrates.base import Sandbox
    from drumsbench.substrates.conformance import ConformanceFailure, check_end_processes
    from drumsbench.substrates.process import ProcessSandbox, ProcessSubstrate

    require(ProcessSubstrate.missing())
    monkeypatch.setattr(ProcessSandbox, "end_processes",
                        Sandbox.end_processes if broken == "missing" else lambda self: None)
    sub = ProcessSubstrate(run_id, state_dir)
    try:
        with pytest.raises(ConformanceFailure, match="end_processes"):
            check_end_processes(sub)
    finally:
        sub.close()


@pytest.mark.parametrize("broken", ["freeze", "thaw", "probe"])
def test_freeze_check_catches_a_freeze_that_does_not_hold(broken, state_dir, run_id, monkeypatch):
    """Positive control of ``check_freeze``: docker sandboxes whose freeze does nothing (a command
    runs), whose thaw does nothing (the sandbox stays stopped), or whose probe never sees the pause
    (the gate would have no evidence of the stall) fail it."""
    from drumsbench.substrates.conformance import ConformanceFailure, check_freeze
    from drumsbench.substrates.containers.docker import DockerSubstrate
    from drumsbench.substrates.containers.docker_sandbox import DockerSandbox

    require(DockerSubstrate.missing())
    if broken == "probe":
        monkeypatch.setattr(DockerSandbox, "probe", lambda self, timeout=5.0: None)
    else:
        monkeypatch.setattr(DockerSandbox, broken, lambda self: None)
    sub = DockerSubstrate(run_id, state_dir)
    try:
        with pytest.raises(ConformanceFailure, match=r"frozen|thaw"):
            check_freeze(sub)
    finally:
        sub.close()
