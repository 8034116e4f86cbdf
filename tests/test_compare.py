"""Substrates side by side: coldstart figures and escape probes, through the real CLI."""

from __future__ import annotations

import json

import pytest

from drumsbench.substrates import registry

from conftest import require
from helpers import cli


@pytest.fixture
def env(tmp_path):
    return {"DRUMSBENCH_STATE": str(tmp_path / "state")}


def _available() -> list[str]:
    return [n for n in registry.names() if registry.get(n).missing() is None]


def test_coldstart_side_by_side(tmp_path, env):
    names = registry.names()
    for n in names:
        require(registry.get(n).missing())
    cli("coldstart", "--substrates", ",".join(names), "-n", "3", "--idle", "1", "--reset-n", "2",
        "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "c.json"), env=env, check=True)
    data = json.loads((tmp_path / "c.json").read_text())
    assert [r["substrate"] for r in data["results"]] == names
    for r in data["results"]:
        assert r["success"]["value"] == 1.0, r["errors"]
        assert r["first_command"]["n"] == 3 and r["first_command"]["p50"]["value"] > 0
        assert r["floor"] is not None and r["ratio_to_floor"] > 0, r["substrate"]
        assert r["reset"], r["substrate"]


@pytest.mark.parametrize("mode", ["staggered", "burst"])
def test_coldstart_modes(tmp_path, env, mode):
    cli("coldstart", "--substrates", "process", "--mode", mode, "-n", "6", "--idle", "2", "--reset-n", "2",
        "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "c.json"), env=env, check=True)
    assert json.loads((tmp_path / "c.json").read_text())["results"][0]["mode"] == mode


def test_escape_probes_report_honestly(tmp_path, env):
    names = _available()
    cli("isolation", "--substrates", ",".join(names), "--out", str(tmp_path / "runs"), "--json",
        str(tmp_path / "i.json"), env=env, check=True)
    data = json.loads((tmp_path / "i.json").read_text())["substrates"]
    for name, row in data.items():
        assert row["canary_control_fired"], name
        probes = {p["probe"]: p for p in row["probes"]}
        isolating = ("write_outside", "read_neighbour", "host_loopback", "network")
        # (fork_bomb may honestly report "did not run" on a slow TCG guest: its processes start too slowly)
        assert all(probes[p]["ran"] for p in isolating), f"{name}: a probe did not run: {probes}"
        assert all(p["control"] == "fired" for p in probes.values()), f"{name}: a control did not fire: {probes}"
        if row["declared"] == "none":
            # process: reported as not isolating files, because it does not (the host's shared
            # places); its sandboxes run as their own uids (a neighbour's home is out of reach) in
            # their own network namespace (the host's loopback is out of reach)
            assert not probes["write_outside"]["contained"]
            assert probes["read_neighbour"]["contained"] and probes["host_loopback"]["contained"]
            assert probes["network"]["contained"]
        else:
            for probe in ("write_outside", "read_neighbour", "host_loopback", "network"):
                assert probes[probe]["contained"], f"{name}: {probes[probe]}"


def test_coldstart_bad_arguments(tmp_path, env):
    proc = cli("coldstart", "--substrates", "process", "--mode", "sideways", "--out", str(tmp_path), env=env)
    assert proc.returncode == 2 and "mode" in proc.stderr.strip().splitlines()[-1]
    proc = cli("coldstart", "--substrates", "nosuch", "--out", str(tmp_path), env=env)
    assert proc.returncode == 2 and "unknown substrate" in proc.stderr
