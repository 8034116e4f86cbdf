"""Substrates load from the built-ins and from the ``drumsbench.substrates`` entry-point group."""

import sys

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.substrates import registry
from drumsbench.substrates.process import ProcessSubstrate


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed-looking distribution that declares one substrate plugin."""
    (tmp_path / "fakeplug.py").write_text(
        "from drumsbench.substrates.process import ProcessSubstrate\n"
        "class Fake(ProcessSubstrate):\n    name = 'fake'\n"
        "class NotOne:\n    pass\n")
    dist = tmp_path / "fakeplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[drumsbench.substrates]\nfake = fakeplug:Fake\nbroken = fakeplug:NotOne\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("fakeplug", None)


def test_plugin_substrate_is_found(plugin):
    assert "fake" in registry.names()
    cls = registry.get("fake")
    assert issubclass(cls, ProcessSubstrate) and cls.name == "fake"


def test_bad_plugin_and_unknown_name(plugin):
    with pytest.raises(UsageError, match="not a Substrate subclass"):
        registry.get("broken")
    with pytest.raises(UsageError, match=r"unknown substrate 'nope'.*process"):
        registry.get("nope")
