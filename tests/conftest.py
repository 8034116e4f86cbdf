"""Shared test fixtures.

``require(reason_or_none)``: skip a test whose system component is missing, with the reason; when
``DRUMSBENCH_REQUIRE_ALL=1`` (set by ``.ci/run``) a missing component fails the test instead, so CI
proves every component.
"""

from __future__ import annotations

import os
import tempfile
import time
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


def _ray_folders() -> set[Path]:
    """Ray's own temp folders (``executors/ray_env.apply``) in the temp folders it may use."""
    return {p for d in {tempfile.gettempdir(), "/tmp"} for p in Path(d).glob("dray-*")}


def _assert_no_new_ray_folder(before: set[Path]) -> None:
    left = _ray_folders() - before
    assert not left, f"Ray temp folder(s) left behind: {sorted(map(str, left))}"


@pytest.fixture(scope="module", autouse=True)
def no_ray_folder_left():
    """Every test module removes the Ray temp folders it made (a CI run once left one in /tmp)."""
    before = _ray_folders()
    yield
    _assert_no_new_ray_folder(before)


@pytest.fixture(scope="session", autouse=True)
def no_ray_folder_left_at_the_end():
    """The same over the whole session: a late Ray helper process may recreate a removed folder."""
    before = _ray_folders()
    yield
    time.sleep(1.0)
    _assert_no_new_ray_folder(before)


@pytest.fixture(scope="session")
def desktop_ready():
    """The desktop's system parts are here (else skip, or fail under DRUMSBENCH_REQUIRE_ALL) and its
    template profile is built (once, cached across runs: never during an attempt)."""
    from drumsbench.envs.desktop import instance
    from drumsbench.envs.desktop.profile import template_profile

    require(instance.missing())
    template_profile()
