"""Price inputs, the headline (USD per valid verified rollout) and full cost attribution.

Headline::

    usd_per_valid_rollout = host_usd_per_hour / valid_rollouts_per_host_hour

Host cost only: inference is excluded and every report says so. The interval of the throughput is
carried through (the bounds swap).

Price inputs come from a file (TOML or JSON, ``load_prices``) with one or more of:

- ``[owned]``: a host you bought — purchase price amortised over months, plus power draw x tariff
  x PUE, plus optional operations per month;
- ``[cloud]``: an on-demand instance in USD per hour, billed with a minimum (default 24 hours: a
  3-hour run is billed 24 h). Reports show the *marginal* figure (per host-hour actually used) and
  the *billed* figure (what this run's length was billed);
- ``[cloud_eur]``: an instance priced in EUR per hour, converted with the exchange rate of the
  day given in the file with its date (never looked up on the network);
- ``[attribution]``: the inputs the fuller figure needs where the ledger has no measurement.

Full attribution (``attribute``): cost per 1,000 verified attempts = 1000 x total attributable
cost / attempts with a trustworthy verifier result (success or failed; invalid attempts cost
money but have no trustworthy result). The host's cost over the measured time is split by slot
time measured in the ledger's phase timings (environment steps and harness, provisioning and
reset, verifier calls, idle slots); GPU/inference, storage, network, warm spares, per-call
verifier fees and amortised integration and operations are inputs.
"""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from drumsbench.core.errors import UsageError
from drumsbench.measure.stats import Estimate, inverse

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12
INFERENCE_EXCLUDED = "excluded: host cost only (inference is not part of this figure)"


class HostPrice(BaseModel, frozen=True):
    """A host's price per hour in USD, however it was derived (``note`` says how)."""

    name: str
    usd_per_host_hour: float = Field(gt=0)
    note: str = ""
    kind: str = "flat"
    minimum_billed_hours: float = Field(0.0, ge=0)

    def billed_hours(self, run_hours: float) -> float:
        return max(run_hours, self.minimum_billed_hours)


DEFAULT_PRICE = HostPrice(
    name="default",
    usd_per_host_hour=0.10,
    note="stated default of USD 0.10 per host-hour for a 2-core host; pass --usd-per-host-hour to change it",
)


def usd_per_valid_rollout(price: HostPrice, valid_per_host_hour: Estimate) -> Estimate:
    return inverse(valid_per_host_hour, price.usd_per_host_hour)


# -- the price file -------------------------------------------------------------------------------

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Owned(_Section):
    name: str = "owned"
    purchase_usd: float = Field(gt=0)
    amortisation_months: float = Field(gt=0, le=240)
    power_w: float = Field(ge=0, le=100_000)
    tariff_usd_per_kwh: float = Field(ge=0, le=10)
    pue: float = Field(1.0, ge=1.0, le=5.0)
    operations_usd_per_month: float = Field(0.0, ge=0)

    def host_price(self) -> HostPrice:
        capital = self.purchase_usd / (self.amortisation_months * HOURS_PER_MONTH)
        power = self.power_w / 1000 * self.pue * self.tariff_usd_per_kwh
        ops = self.operations_usd_per_month / HOURS_PER_MONTH
        note = (f"USD {self.purchase_usd:g} over {self.amortisation_months:g} months ({capital:.4f}/h) + "
                f"{self.power_w:g} W x PUE {self.pue:g} x USD {self.tariff_usd_per_kwh:g}/kWh ({power:.4f}/h)"
                + (f" + operations USD {self.operations_usd_per_month:g}/month ({ops:.4f}/h)" if ops else ""))
        return HostPrice(name=self.name, usd_per_host_hour=capital + power + ops, note=note, kind="owned")


class Cloud(_Section):
    name: str = "cloud"
    usd_per_hour: float = Field(gt=0, le=1000)
    minimum_billed_hours: float = Field(24.0, ge=0)

    def host_price(self) -> HostPrice:
        note = f"on-demand USD {self.usd_per_hour:g}/h, billed with a {self.minimum_billed_hours:g}-hour minimum"
        return HostPrice(name=self.name, usd_per_host_hour=self.usd_per_hour, note=note, kind="cloud",
                         minimum_billed_hours=self.minimum_billed_hours)


class CloudEur(_Section):
    name: str = "cloud_eur"
    eur_per_hour: float = Field(gt=0, le=1000)
    usd_per_eur: float = Field(gt=0.5, lt=2.0)
    rate_date: dt.date
    minimum_billed_hours: float = Field(0.0, ge=0)

    @field_validator("rate_date")
    @classmethod
    def _not_future(cls, v: dt.date) -> dt.date:
        if v > dt.date.today() + dt.timedelta(days=1):
            raise ValueError(f"{v} is in the future")
        return v

    def host_price(self) -> HostPrice:
        usd = self.eur_per_hour * self.usd_per_eur
        note = (f"EUR {self.eur_per_hour:g}/h x {self.usd_per_eur:g} USD/EUR (rate of {self.rate_date.isoformat()})"
                + (f", billed with a {self.minimum_billed_hours:g}-hour minimum" if self.minimum_billed_hours else ""))
        return HostPrice(name=self.name, usd_per_host_hour=usd, note=note, kind="cloud_eur",
                         minimum_billed_hours=self.minimum_billed_hours)


class AttributionInputs(_Section):
    """Inputs for the cost lines the ledger cannot measure. Absent GPU/inference: stated as excluded."""

    inference_usd_per_hour: float | None = Field(None, ge=0)
    inference_usd_per_step: float | None = Field(None, ge=0)
    # a model behind an endpoint (``--policy endpoint``): its measured tokens at these prices
    inference_usd_per_million_input_tokens: float | None = Field(None, ge=0)
    inference_usd_per_million_output_tokens: float | None = Field(None, ge=0)
    storage_gib: float = Field(0.0, ge=0)
    storage_usd_per_gib_month: float = Field(0.0, ge=0)
    network_gib_per_attempt: float = Field(0.0, ge=0)
    network_usd_per_gib: float = Field(0.0, ge=0)
    idle_reserve_sandboxes: int = Field(0, ge=0)
    verifier_usd_per_call: float = Field(0.0, ge=0)
    integration_usd: float = Field(0.0, ge=0)
    integration_amortisation_months: float = Field(12.0, gt=0)
    operations_usd_per_month: float = Field(0.0, ge=0)


class PriceFile(_Section):
    schema_: str = Field("drumsbench.prices/1", alias="schema")
    source: str = ""
    owned: Owned | None = None
    cloud: Cloud | None = None
    cloud_eur: CloudEur | None = None
    attribution: AttributionInputs = Field(default_factory=AttributionInputs)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def hosts(self) -> list[HostPrice]:
        return [s.host_price() for s in (self.owned, self.cloud, self.cloud_eur) if s is not None]


SECTIONS: dict[str, type[BaseModel]] = {"owned": Owned, "cloud": Cloud, "cloud_eur": CloudEur,
                                        "attribution": AttributionInputs}

FIXES = {
    "purchase_usd": "give the host's purchase price in USD, e.g. purchase_usd = 2400",
    "amortisation_months": "give the months to write the purchase off over, e.g. amortisation_months = 36",
    "power_w": "give the measured or rated power draw in watts, e.g. power_w = 120",
    "tariff_usd_per_kwh": "give the electricity tariff in USD per kWh, e.g. tariff_usd_per_kwh = 0.15",
    "pue": "give the power usage effectiveness, 1.0 (none) to 5, e.g. pue = 1.4",
    "operations_usd_per_month": "give USD per month, 0 or more",
    "usd_per_hour": "give the on-demand price in USD per hour, e.g. usd_per_hour = 0.096",
    "minimum_billed_hours": "give the billing minimum in hours, e.g. 24 (0 for none)",
    "eur_per_hour": "give the price in EUR per hour, e.g. eur_per_hour = 0.0119",
    "usd_per_eur": "give USD for one EUR on the rate date, e.g. usd_per_eur = 1.08",
    "rate_date": "give the date of the exchange rate as YYYY-MM-DD, e.g. rate_date = 2025-06-02",
    "name": "give a short text name",
    "schema": 'write schema = "drumsbench.prices/1" or leave it out',
}


def _one_line(path: Path, e: ValidationError) -> UsageError:
    first = e.errors()[0]
    loc = [str(x) for x in first["loc"]]
    field = loc[-1] if loc else "?"
    where = f"[{loc[0]}].{'.'.join(loc[1:])}" if len(loc) > 1 else field
    kind = first["type"]
    if kind == "extra_forbidden":
        if len(loc) == 1:
            known = ", ".join(f"[{s}]" for s in SECTIONS)
            return UsageError(f"--price {path}: unknown table or key {field!r}; use {known} (see examples/prices/)")
        known = ", ".join(SECTIONS[loc[0]].model_fields) if loc[0] in SECTIONS else ""
        return UsageError(f"--price {path}: {where}: unknown field; known fields: {known}")
    if kind == "missing":
        return UsageError(f"--price {path}: {where} is missing; {FIXES.get(field, 'add it')}")
    value = first.get("input")
    shown = f" ({value!r})" if not isinstance(value, dict | list) else ""
    msg = first["msg"].removeprefix("Value error, ")
    return UsageError(f"--price {path}: {where}{shown}: {msg}; {FIXES.get(field, 'fix the value')}")


def parse_prices(data: Any, path: Path) -> PriceFile:
    if not isinstance(data, dict):
        raise UsageError(f"--price {path}: the file must hold a table of [owned], [cloud], [cloud_eur]")
    try:
        prices = PriceFile.model_validate({**data, "source": str(path)})
    except ValidationError as e:
        raise _one_line(path, e) from None
    if not prices.hosts():
        raise UsageError(f"--price {path}: no host priced; add an [owned], [cloud] or [cloud_eur] table "
                         f"(see examples/prices/)")
    return prices


def load_prices(path: Path | str) -> PriceFile:
    """Read and validate a price file (``.toml`` or ``.json``); one-line ``UsageError`` on any problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"--price: no file at {path}; give a price file (see examples/prices/)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--price: cannot read {path} ({e}); give a readable TOML or JSON file") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--price {path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"--price {path}: not valid TOML ({e}); see examples/prices/") from None
    return parse_prices(data, path)


# -- the headline per host ----------------------------------------------------------------------

class HostFigure(BaseModel):
    """USD per valid rollout on one priced host, marginal and as billed for this run's length."""

    name: str
    kind: str
    usd_per_host_hour: float
    derivation: str
    run_hours: float
    minimum_billed_hours: float
    billed_hours: float
    marginal_usd: float  # usd_per_host_hour x run hours
    billed_usd: float  # usd_per_host_hour x billed hours
    usd_per_valid_rollout: Estimate  # marginal: host_usd_per_hour / valid_per_host_hour
    billed_usd_per_valid_rollout: Estimate  # the same with this run's billed hours spread over its used hours
    inference_cost: str = INFERENCE_EXCLUDED


def host_figures(hosts: list[HostPrice], valid_per_host_hour: Estimate, run_hours: float) -> list[HostFigure]:
    out = []
    for h in hosts:
        billed_h = h.billed_hours(run_hours)
        factor = billed_h / run_hours if run_hours > 0 else 1.0
        out.append(HostFigure(
            name=h.name, kind=h.kind, usd_per_host_hour=h.usd_per_host_hour, derivation=h.note,
            run_hours=run_hours, minimum_billed_hours=h.minimum_billed_hours, billed_hours=billed_h,
            marginal_usd=h.usd_per_host_hour * run_hours, billed_usd=h.usd_per_host_hour * billed_h,
            usd_per_valid_rollout=usd_per_valid_rollout(h, valid_per_host_hour),
            billed_usd_per_valid_rollout=inverse(valid_per_host_hour, h.usd_per_host_hour * factor),
        ))
    return out


# -- the warm pool's reserve (measured) -----------------------------------------------------------

class PoolUse(BaseModel):
    """What a warm pool (``rollout.pool``) held and did: written by the run beside each window as a
    ``pool`` artifact (named by the window's label, ``run`` for a plain run), read by ``pool_use``.

    ``idle_sandbox_s``: sandbox-seconds held idle (the integral of the idle count over time);
    ``create_s``/``check_s``/``destroy_s``: seconds of background work; ``idle_mib_each``: the host
    memory one idle sandbox held (MemAvailable before and after the first fill, / size; None: not
    measured); ``host_mem_mib``: the host's memory (MemTotal)."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(ge=0)
    created: int = 0
    create_failures: int = 0
    create_s: float = 0.0
    checks: int = 0
    rechecks: int = 0
    acquire_checks: int = 0
    check_s: float = 0.0
    refused: int = 0
    destroy_s: float = 0.0
    hits: int = 0
    misses: int = 0
    acquire_s: float = 0.0
    idle_sandbox_s: float = 0.0
    idle_now: int = 0
    closed_destroyed: int = 0
    wall_s: float = 0.0
    idle_mib_each: float | None = None
    host_mem_mib: float | None = None

    @property
    def work_s(self) -> float:
        """Background work: creating, checking and destroying pooled sandboxes."""
        return self.create_s + self.check_s + self.destroy_s

    def plus(self, other: PoolUse) -> PoolUse:
        """Two windows' use together (sizes: the larger; memory: the mean of the measured ones)."""
        add = {k: getattr(self, k) + getattr(other, k) for k in (
            "created", "create_failures", "create_s", "checks", "rechecks", "acquire_checks", "check_s", "refused",
            "destroy_s", "hits", "misses", "acquire_s", "idle_sandbox_s", "closed_destroyed", "wall_s")}
        mibs = [m for m in (self.idle_mib_each, other.idle_mib_each) if m is not None]
        return PoolUse(size=max(self.size, other.size), idle_now=other.idle_now,
                       idle_mib_each=sum(mibs) / len(mibs) if mibs else None,
                       host_mem_mib=other.host_mem_mib or self.host_mem_mib, **add)


POOL_KIND = "pool"  # the ledger's artifact kind of ``PoolUse``


def pool_use(ledger: Any, run_id: str, labels: list[str] | None = None) -> PoolUse | None:
    """The pools' use of windows ``labels`` of ``run_id`` (None: every window, or the plain run);
    None when the run had no pool."""
    total: PoolUse | None = None
    for name, data in ledger.artifacts(run_id, POOL_KIND).items():
        if labels is not None and name not in labels:
            continue
        one = PoolUse.model_validate(data)
        total = one if total is None else total.plus(one)
    return total


def pool_reserve_usd(host: HostPrice, pool: PoolUse, usd_per_slot_s: float) -> tuple[float, str]:
    """The pool's cost on ``host``: its idle sandboxes' share of the host's memory for the time they
    were held, plus its background work (create, check, destroy) priced like a slot's time."""
    held_h = pool.idle_sandbox_s / 3600
    mem_usd = 0.0
    if pool.idle_mib_each is not None and pool.host_mem_mib:
        share = max(0.0, pool.idle_mib_each) / pool.host_mem_mib
        mem_usd = held_h * share * host.usd_per_host_hour
        mem = (f"{held_h:.3g} sandbox-h held idle x {max(0.0, pool.idle_mib_each):.1f} MiB each of "
               f"{pool.host_mem_mib:.0f} MiB host RAM x USD {host.usd_per_host_hour:.4g}/h")
    else:
        mem = f"{held_h:.3g} sandbox-h held idle (memory per sandbox not measured: not priced)"
    work_usd = pool.work_s * usd_per_slot_s
    detail = (f"warm pool of {pool.size}: {mem}; {pool.work_s:.1f} s of background work (create {pool.create_s:.1f}, "
              f"check {pool.check_s:.1f}, destroy {pool.destroy_s:.1f}) at the slot rate; {pool.hits} hits, "
              f"{pool.misses} misses, {pool.refused} refused")
    return mem_usd + work_usd, detail


def pool_cost(host: HostPrice, pool: PoolUse, handed_out: int, slots: int) -> tuple[CostLine, float | None]:
    """The reserve of one measured pool outside a run (``coldstart``): its cost over the measurement
    (memory share while held, background work at ``host``'s price per slot-second with ``slots``
    slots), per 1,000 sandboxes handed out; and the hourly cost of holding ``size`` idle sandboxes
    (None: memory not measured)."""
    per_slot_s = host.usd_per_host_hour / 3600 / max(1, slots)
    usd, detail = pool_reserve_usd(host, pool, per_slot_s)
    line = CostLine(name="idle reserve (warm pool)", usd=usd,
                    per_1k_verified=1000 * usd / handed_out if handed_out else None, source="measured",
                    detail=f"{detail}; per 1,000 sandboxes handed out ({handed_out} here); host {host.name} at USD "
                           f"{host.usd_per_host_hour:.4g}/h over {slots} slot(s)")
    hourly = None
    if pool.idle_mib_each is not None and pool.host_mem_mib:
        hourly = pool.size * max(0.0, pool.idle_mib_each) / pool.host_mem_mib * host.usd_per_host_hour
    return line, hourly


# -- full attribution -----------------------------------------------------------------------------

class CostLine(BaseModel):
    name: str
    usd: float | None  # None: excluded (no input)
    per_1k_verified: float | None
    source: Literal["measured", "input", "measured+input", "excluded"]
    detail: str


class Attribution(BaseModel):
    host: str
    scope: str
    attempts: int
    verified_attempts: int
    host_hours: float
    lines: list[CostLine]
    total_usd: float
    usd_per_1k_verified: float | None
    note: str = ("cost per 1,000 verified attempts = 1000 x total attributable cost / attempts with a "
                 "trustworthy verifier result (success or failed)")


def attribute(host: HostPrice, inputs: AttributionInputs, use: Any, scope: str = "",
              pool: PoolUse | None = None) -> Attribution:
    """Split what ``use`` (a ``measure.windows.Usage``) cost on ``host`` into its lines; ``pool``
    (``pool_use``): the warm pool the windows really held, priced in the idle reserve line."""
    hours = use.host_seconds / 3600
    host_usd = host.usd_per_host_hour * hours
    per_slot_s = host_usd / use.slot_seconds if use.slot_seconds > 0 else 0.0
    verified = use.verified
    lines: list[CostLine] = []

    def add(name: str, usd: float | None, source: Literal["measured", "input", "measured+input", "excluded"],
            detail: str) -> None:
        per = None if usd is None or not verified else 1000 * usd / verified
        lines.append(CostLine(name=name, usd=usd, per_1k_verified=per, source=source, detail=detail))

    work_s = use.steps_s + use.harness_s
    res = ""
    if use.cpu_core_hours is not None:
        res = f"; host measured {use.cpu_core_hours:.3g} CPU core-h busy, {use.memory_gib_hours or 0:.3g} GiB-h RAM"
    add("host CPU and RAM hours (steps, gates, policy)", work_s * per_slot_s, "measured",
        f"{work_s / 3600:.3g} slot-h of {use.slot_seconds / 3600:.3g} slot-h in {hours:.3g} host-h at "
        f"USD {host.usd_per_host_hour:.4g}/h{res}")
    per_in, per_out = inputs.inference_usd_per_million_input_tokens, inputs.inference_usd_per_million_output_tokens
    priced_tokens = per_in is not None or per_out is not None
    if inputs.inference_usd_per_hour is None and inputs.inference_usd_per_step is None and not priced_tokens:
        why = (f"; {use.prompt_tokens:,} input and {use.completion_tokens:,} output tokens measured over "
               f"{use.inference_calls:,} endpoint calls ({use.inference_s:.1f} s), unpriced"
               if use.inference_calls else "")
        add("GPU / inference", None, "excluded",
            f"excluded: no inference price given (the headline excludes it too){why}")
    else:
        usd = (inputs.inference_usd_per_hour or 0) * hours + (inputs.inference_usd_per_step or 0) * use.steps
        detail = (f"USD {inputs.inference_usd_per_hour or 0:g}/h x {hours:.3g} h + USD "
                  f"{inputs.inference_usd_per_step or 0:g}/step x {use.steps} steps")
        if priced_tokens:
            usd += (per_in or 0) * use.prompt_tokens / 1e6 + (per_out or 0) * use.completion_tokens / 1e6
            detail += (f" + {use.prompt_tokens:,} input tokens x USD {per_in or 0:g}/M + {use.completion_tokens:,} "
                       f"output tokens x USD {per_out or 0:g}/M (measured over {use.inference_calls:,} endpoint "
                       f"calls, {use.inference_s:.1f} s)")
        add("GPU / inference", usd, "measured+input" if priced_tokens else "input", detail)
    storage = inputs.storage_gib * inputs.storage_usd_per_gib_month * hours / HOURS_PER_MONTH
    network = inputs.network_gib_per_attempt * use.attempts * inputs.network_usd_per_gib
    add("storage and network", storage + network, "input",
        f"{inputs.storage_gib:g} GiB x USD {inputs.storage_usd_per_gib_month:g}/GiB-month x {hours:.3g} h; "
        f"{inputs.network_gib_per_attempt:g} GiB/attempt x {use.attempts} attempts x USD "
        f"{inputs.network_usd_per_gib:g}/GiB")
    add("provisioning and reset time", use.provision_reset_s * per_slot_s, "measured",
        f"{use.provision_reset_s:.1f} slot-s of provision, reset and teardown")
    spare_usd = inputs.idle_reserve_sandboxes * (per_slot_s * 3600) * hours
    pool_usd, pool_detail = pool_reserve_usd(host, pool, per_slot_s) if pool is not None else (0.0, "no warm pool")
    add("idle reserve", use.idle_slot_s * per_slot_s + spare_usd + pool_usd,
        "measured+input" if inputs.idle_reserve_sandboxes else "measured",
        f"{use.idle_slot_s:.1f} idle slot-s (controls, drain); {pool_detail}; {inputs.idle_reserve_sandboxes} "
        f"further warm spare(s) (price file) x {hours:.3g} h")
    add("verifier calls", use.verify_s * per_slot_s + inputs.verifier_usd_per_call * use.verifier_calls,
        "measured+input" if inputs.verifier_usd_per_call else "measured",
        f"{use.verify_s:.1f} slot-s over {use.verifier_calls} calls; USD {inputs.verifier_usd_per_call:g}/call")
    billed = host.billed_hours(hours)
    if billed > hours:  # the same billing minimum as the headline's billed figure: unused hours are paid too
        add("billing minimum (hours paid, not used)", (billed - hours) * host.usd_per_host_hour, "input",
            f"{host.minimum_billed_hours:g} h minimum: {billed - hours:.3g} h beyond the {hours:.3g} h used x "
            f"USD {host.usd_per_host_hour:.4g}/h")
    integ = inputs.integration_usd / (inputs.integration_amortisation_months * HOURS_PER_MONTH) * hours
    ops = inputs.operations_usd_per_month / HOURS_PER_MONTH * hours
    add("amortised integration and operations", integ + ops, "input",
        f"USD {inputs.integration_usd:g} over {inputs.integration_amortisation_months:g} months + USD "
        f"{inputs.operations_usd_per_month:g}/month, for {hours:.3g} h"
        + ("; the owned host's own operations are in its host price" if host.kind == "owned" else ""))
    total = sum(ln.usd for ln in lines if ln.usd is not None)
    return Attribution(host=host.name, scope=scope, attempts=use.attempts, verified_attempts=verified,
                       host_hours=hours, lines=lines, total_usd=total,
                       usd_per_1k_verified=1000 * total / verified if verified else None)
