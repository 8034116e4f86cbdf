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
