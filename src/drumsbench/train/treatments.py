"""What each treatment does with an invalid attempt (reward ``None``) in a GRPO group.

Contract of ``group_advantages(rewards, treatment)``: one entry per group member, in order; an
entry of ``None`` means the member carries no gradient (it never reaches the loss). Advantage =
(reward - mean) / std over the members the treatment puts in the group statistics; a group whose
std is 0 gives every loss member advantage 0.

| treatment | invalid's reward | in mean/std | in the loss |
|---|---|---|---|
| ``exclude`` (DrumsBench's rule) | none | no | no |
| ``zero`` (the common default) | 0 | yes | yes |
| ``mask`` (loss masked, statistics not: a bug seen in public trainers) | 0 in the statistics | yes | no |
| ``retry`` (re-sampled until valid, cost counted; still invalid after the retries: excluded) | none | no | no |
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from drumsbench.core.errors import UsageError

STD_EPS = 1e-6


class Treatment(StrEnum):
    EXCLUDE = "exclude"
    ZERO = "zero"
    MASK = "mask"
    RETRY = "retry"


def parse_treatments(text: str) -> list[Treatment]:
    out: list[Treatment] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        try:
            out.append(Treatment(name))
        except ValueError:
            raise UsageError(f"--treatments: unknown treatment {name!r}; choose from "
                             f"{', '.join(t.value for t in Treatment)}") from None
    if not out:
        raise UsageError("--treatments: give at least one, e.g. exclude,zero,mask,retry")
    if len(set(out)) != len(out):
        raise UsageError(f"--treatments: {text!r} names a treatment twice")
    return out


def group_advantages(rewards: Sequence[float | None], treatment: Treatment) -> list[float | None]:
    """Advantages of one group's members (``None``: kept out of the loss)."""
    if treatment in (Treatment.EXCLUDE, Treatment.RETRY):
        stats = [r for r in rewards if r is not None]
        in_loss = [r is not None for r in rewards]
    elif treatment is Treatment.ZERO:
        stats = [0.0 if r is None else r for r in rewards]
        in_loss = [True] * len(rewards)
    else:  # MASK
        stats = [0.0 if r is None else r for r in rewards]
        in_loss = [r is not None for r in rewards]
    if not stats:
        return [None] * len(rewards)
    mean = sum(stats) / len(stats)
    std = math.sqrt(sum((s - mean) ** 2 for s in stats) / len(stats))
    out: list[float | None] = []
    for r, keep in zip(rewards, in_loss, strict=True):
        if not keep:
            out.append(None)
            continue
        value = 0.0 if r is None else r
        out.append(0.0 if std < STD_EPS else (value - mean) / (std + STD_EPS))
    return out


__all__ = ["Treatment", "group_advantages", "parse_treatments"]
