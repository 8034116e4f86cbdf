"""Price files, the headline per host (marginal and billed), EUR conversion and full attribution."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path

import pytest

from drumsbench.core.errors import UsageError
from drumsbench.measure.cost import (
    DEFAULT_PRICE,
    HOURS_PER_MONTH,
    AttributionInputs,
    HostPrice,
    attribute,
    host_figures,
    load_prices,
    parse_prices,
    usd_per_valid_rollout,
)
from drumsbench.measure.stats import Estimate
from drumsbench.measure.windows import Usage

from helpers import ROOT, cli

EXAMPLES = ROOT / "examples" / "prices"
RATE = Estimate(value=1000.0, low=800.0, high=1250.0, n=500, method="test")


def test_examples_load_and_price_each_kind():
    owned = load_prices(EXAMPLES / "owned-server.toml").hosts()
    cloud = load_prices(EXAMPLES / "on-demand.toml").hosts()
    eur = load_prices(EXAMPLES / "eur-instance.toml").hosts()
    assert [h.kind for h in owned + cloud + eur] == ["owned", "cloud", "cloud_eur"]
    assert cloud[0].minimum_billed_hours == 24


def test_owned_host_hour_is_amortisation_plus_power_plus_operations(tmp_path):
    p = tmp_path / "owned.toml"
    p.write_text("[owned]\npurchase_usd = 3650\namortisation_months = 10\npower_w = 200\n"
                 "tariff_usd_per_kwh = 0.25\npue = 1.2\noperations_usd_per_month = 73\n")
    h = load_prices(p).hosts()[0]
    expected = 3650 / (10 * HOURS_PER_MONTH) + 0.2 * 1.2 * 0.25 + 73 / HOURS_PER_MONTH
    assert h.usd_per_host_hour == pytest.approx(expected)
    assert "200 W" in h.note and "PUE 1.2" in h.note and "operations" in h.note


def test_24_hour_minimum_changes_the_billed_cost_of_a_short_run():
    cloud = load_prices(EXAMPLES / "on-demand.toml").hosts()[0]
    short, = host_figures([cloud], RATE, run_hours=3.0)
    assert short.billed_hours == 24 and short.run_hours == 3
    assert short.marginal_usd == pytest.approx(3 * cloud.usd_per_host_hour)
    assert short.billed_usd == pytest.approx(24 * cloud.usd_per_host_hour)
    # marginal: price / throughput; billed: 8x that for a 3-hour run billed 24 h, interval carried
    assert short.usd_per_valid_rollout.value == pytest.approx(cloud.usd_per_host_hour / 1000)
    assert short.billed_usd_per_valid_rollout.value == pytest.approx(8 * short.usd_per_valid_rollout.value)
    assert short.billed_usd_per_valid_rollout.low == pytest.approx(8 * cloud.usd_per_host_hour / 1250)
    assert short.billed_usd_per_valid_rollout.high == pytest.approx(8 * cloud.usd_per_host_hour / 800)
    long, = host_figures([cloud], RATE, run_hours=30.0)
    assert long.billed_hours == 30
    assert long.billed_usd_per_valid_rollout.value == pytest.approx(long.usd_per_valid_rollout.value)
    owned = load_prices(EXAMPLES / "owned-server.toml").hosts()[0]
    o, = host_figures([owned], RATE, run_hours=3.0)
    assert o.billed_usd == pytest.approx(o.marginal_usd)  # no minimum on an owned host


def test_eur_prices_use_the_given_rate(tmp_path):
    def host(rate: float):
        p = tmp_path / f"eur-{rate}.toml"
        p.write_text(f"[cloud_eur]\neur_per_hour = 0.5\nusd_per_eur = {rate}\nrate_date = 2026-01-15\n")
        return load_prices(p).hosts()[0]

    a, b = host(1.10), host(1.20)
    assert a.usd_per_host_hour == pytest.approx(0.55)
    assert b.usd_per_host_hour == pytest.approx(0.60)
    assert "1.1 USD/EUR" in a.note and "2026-01-15" in a.note
    fa, = host_figures([a], RATE, 1.0)
    assert fa.usd_per_valid_rollout.value == pytest.approx(0.55 / 1000)


def test_json_price_file(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"cloud": {"usd_per_hour": 0.2, "minimum_billed_hours": 0},
                             "cloud_eur": {"eur_per_hour": 0.1, "usd_per_eur": 1.05, "rate_date": "2026-03-01"}}))
    hosts = load_prices(p).hosts()
    assert [h.usd_per_host_hour for h in hosts] == pytest.approx([0.2, 0.105])


def test_backward_compatible_host_price():
    assert DEFAULT_PRICE.usd_per_host_hour == 0.10
    h = HostPrice(name="given", usd_per_host_hour=0.5)
    assert usd_per_valid_rollout(h, RATE).value == pytest.approx(0.0005)
    assert usd_per_valid_rollout(h, RATE).low == pytest.approx(0.5 / 1250)
    assert HostPrice.model_validate(DEFAULT_PRICE.model_dump(mode="json")) == DEFAULT_PRICE


@pytest.mark.parametrize("text,needle", [
    ("[owned]\npurchase_usd = -5\namortisation_months = 36\npower_w = 100\ntariff_usd_per_kwh = 0.1\n",
     "[owned].purchase_usd"),
    ("[owned]\npurchase_usd = 5\npower_w = 100\ntariff_usd_per_kwh = 0.1\n", "amortisation_months is missing"),
    ("[owned]\npurchase_usd = 5\namortisation_months = 3\npower_w = 1\ntariff_usd_per_kwh = 0.1\npue = 0.7\n",
     "[owned].pue"),
    ("[cloud]\nusd_per_hour = 0.1\nminimum_hours = 24\n", "[cloud].minimum_hours: unknown field"),
    ("[cloud]\nusd_per_hour = 0\n", "[cloud].usd_per_hour"),
    ("[cloud_eur]\neur_per_hour = 0.1\nusd_per_eur = 1.1\n", "rate_date is missing"),
    ("[cloud_eur]\neur_per_hour = 0.1\nusd_per_eur = 108\nrate_date = 2026-01-01\n", "usd_per_eur"),
    ("[cloud_eur]\neur_per_hour = 0.1\nusd_per_eur = 1.1\nrate_date = 2999-01-01\n", "in the future"),
    ("[clod]\nusd_per_hour = 1\n", "unknown table or key 'clod'"),
    ("x = [", "not valid TOML"),
    ("", "no host priced"),
])
def test_bad_price_files_one_line_exit_2(tmp_path, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        load_prices(p)
    assert needle in str(e.value) and "\n" not in str(e.value)
    proc = cli("run", "--duration", "1s", "--out", str(tmp_path / "runs"), "--price", str(p),
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
    ledger = tmp_path / "runs" / "ledger.sqlite"
    if ledger.exists():
        assert sqlite3.connect(ledger).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_missing_price_file(tmp_path):
    proc = cli("run", "--out", str(tmp_path), "--price", str(tmp_path / "none.toml"),
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    assert proc.returncode == 2 and "--price: no file at" in proc.stderr.strip().splitlines()[-1]


def _use(**kw) -> Usage:
    base = dict(host_seconds=3600.0, slot_seconds=7200.0, attempts=110, verified=100, verifier_calls=105, steps=1000,
                provision_reset_s=600.0, steps_s=3000.0, verify_s=1800.0, attempt_s=6000.0,
                cpu_core_hours=1.5, memory_gib_hours=2.0)
    base.update(kw)
    return Usage(**base)


def test_attribution_lines_and_cost_per_1000_verified():
    host = HostPrice(name="h", usd_per_host_hour=2.0)
    a = attribute(host, AttributionInputs(), _use())
    lines = {ln.name: ln for ln in a.lines}
    assert set(lines) == {"host CPU and RAM hours (steps, gates, policy)", "GPU / inference", "storage and network",
                          "provisioning and reset time", "idle reserve", "verifier calls",
                          "amortised integration and operations"}
    # the host's 2 USD are split by measured slot time: 7200 slot-s -> 1/3600 USD per slot-s
    assert lines["provisioning and reset time"].usd == pytest.approx(600 / 3600)
    assert lines["verifier calls"].usd == pytest.approx(1800 / 3600)
    assert lines["idle reserve"].usd == pytest.approx(1200 / 3600)  # 7200 slot-s - 6000 s of attempts
    assert lines["host CPU and RAM hours (steps, gates, policy)"].usd == pytest.approx(3600 / 3600)
    assert lines["GPU / inference"].usd is None and "excluded" in lines["GPU / inference"].detail
    assert a.total_usd == pytest.approx(2.0)
    assert a.usd_per_1k_verified == pytest.approx(1000 * 2.0 / 100)  # invalid attempts cost, never count
    assert all(ln.source == "measured" for ln in a.lines if ln.name in ("provisioning and reset time",
                                                                          "verifier calls"))


def test_attribution_applies_the_billing_minimum_like_the_headline():
    """A 24-hour minimum on a 2-hour use: the 22 unused hours are a line of their own, and the total is
    what the host bills (24 h x price), as in the headline's billed figure."""
    host = HostPrice(name="cloud", usd_per_host_hour=2.0, kind="cloud", minimum_billed_hours=24)
    a = attribute(host, AttributionInputs(), _use())
    lines = {ln.name: ln for ln in a.lines}
    hours = a.host_hours
    assert lines["billing minimum (hours paid, not used)"].usd == pytest.approx((24 - hours) * 2.0)
    assert a.total_usd == pytest.approx(24 * 2.0)
    flat = attribute(HostPrice(name="flat", usd_per_host_hour=2.0), AttributionInputs(), _use())
    assert "billing minimum (hours paid, not used)" not in {ln.name for ln in flat.lines}


def test_attribution_inputs():
    host = HostPrice(name="h", usd_per_host_hour=2.0)
    inputs = AttributionInputs(inference_usd_per_hour=3.0, inference_usd_per_step=0.001, storage_gib=730,
                               storage_usd_per_gib_month=0.1, network_gib_per_attempt=0.01, network_usd_per_gib=1.0,
                               idle_reserve_sandboxes=1, verifier_usd_per_call=0.01, integration_usd=876,
                               integration_amortisation_months=1.2, operations_usd_per_month=730)
    a = attribute(host, inputs, _use())
    lines = {ln.name: ln for ln in a.lines}
    assert lines["GPU / inference"].usd == pytest.approx(3.0 + 1.0)
    assert lines["storage and network"].usd == pytest.approx(0.1 + 1.1)
    assert lines["idle reserve"].usd == pytest.approx(1200 / 3600 + 1.0)  # one warm spare = one slot-hour
    assert lines["verifier calls"].usd == pytest.approx(0.5 + 1.05)
    assert lines["amortised integration and operations"].usd == pytest.approx(876 / (1.2 * 730) + 1.0)
    assert a.usd_per_1k_verified == pytest.approx(1000 * a.total_usd / 100)


def test_run_with_price_files_reports_each_host(tmp_path):
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "runs"
    prices = [str(EXAMPLES / f) for f in ("owned-server.toml", "on-demand.toml", "eur-instance.toml")]
    proc = cli("run", "--duration", "2s", "--concurrency", "2", "--out", str(out), "--json", str(tmp_path / "r.json"),
               "--no-progress", *[a for p in prices for a in ("--price", p)], env=env, check=True)
    data = json.loads((tmp_path / "r.json").read_text())
    figures = data["costs"]["prices"]
    assert [f["kind"] for f in figures] == ["owned", "cloud", "cloud_eur"]
    cloud = figures[1]
    assert cloud["billed_hours"] == 24 and cloud["billed_usd"] > 100 * cloud["marginal_usd"]
    assert all("excluded" in f["inference_cost"] for f in figures)
    assert data["price"]["kind"] == "owned"  # the run's own headline uses the first priced host
    assert "billed" in proc.stdout and "GPU / inference" in proc.stdout
    # the price files are kept with the run: the report shows them again without --price
    cli("report", data["run_id"], "--out", str(out), "--json", str(tmp_path / "again.json"), env=env, check=True)
    again = json.loads((tmp_path / "again.json").read_text())
    assert [f["name"] for f in again["costs"]["prices"]] == [f["name"] for f in figures]
    assert again["costs"]["attribution"][0]["verified_attempts"] == data["valid"]


def test_rate_date_today_is_accepted(tmp_path):
    today = dt.date.today().isoformat()
    prices = parse_prices({"cloud_eur": {"eur_per_hour": 1, "usd_per_eur": 1.1, "rate_date": today}}, Path("x"))
    assert prices.cloud_eur is not None and prices.cloud_eur.rate_date.isoformat() == today
