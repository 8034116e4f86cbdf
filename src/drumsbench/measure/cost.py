"""Price inputs and the headline: USD per valid verified rollout.

usd_per_valid_rollout = host_usd_per_hour / valid_rollouts_per_host_hour. Host cost only:
inference is excluded and every report says so.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from drumsbench.measure.stats import Estimate, inverse


class HostPrice(BaseModel, frozen=True):
    name: str
    usd_per_host_hour: float = Field(gt=0)
    note: str = ""


DEFAULT_PRICE = HostPrice(
    name="default",
    usd_per_host_hour=0.10,
    note="stated default of USD 0.10 per host-hour for a 2-core host; pass --usd-per-host-hour to change it",
)


def usd_per_valid_rollout(price: HostPrice, valid_per_host_hour: Estimate) -> Estimate:
    return inverse(valid_per_host_hour, price.usd_per_host_hour)
