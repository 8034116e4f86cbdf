"""Shared test fixtures.

``require(reason_or_none)``: skip a test whose system component is missing, with the reason; when
``DRUMSBENCH_REQUIRE_ALL=1`` (set by ``.ci/run``) a missing component fails the test instead, so CI
proves every component.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REQUIRE_ALL = os.environ.get("DRUMSBENCH_REQUIRE_ALL") == "1"


def require(missing: str | None) -> None:
    if missing is None:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required component missing (DRUMSBENCH_REQUIRE_ALL=1): {missing}")
    pytest.skip(missing)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:10]
