"""The GRPO-style update: every decision of an attempt shares its group advantage; a clipped
policy-gradient loss (PPO's ratio clip against the acting weights); no value network.

Contract of ``update``: only samples whose advantage is not ``None`` enter the loss; the function
returns the sample ids that did (the trainer stores them with the batch, so a test can check on
the batch itself that no invalid attempt reached the loss). The loss is the mean over the loss
samples' decisions of ``-min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drumsbench.train.policy_net import Decision

if TYPE_CHECKING:
    import torch


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@contextmanager
def torch_scratch() -> Iterator[None]:
    """torch's first optimizer step creates an (empty) inductor cache folder, by default
    ``/tmp/torchinductor_<user>``; inside this context it goes to a temporary folder that is removed
    afterwards, so a training run leaves nothing on the host (a cache folder the caller set is kept)."""
    if os.environ.get(CACHE_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="drumsbench-torch-") as tmp:
        os.environ[CACHE_ENV] = tmp
        try:
            yield
        finally:
            os.environ.pop(CACHE_ENV, None)


@dataclass
class Sample:
    """One attempt's decisions with its advantage (``None``: out of the loss) and ledger seq."""

    seq: int
    decisions: list[Decision]
    advantage: float | None


@dataclass
class UpdateStats:
    in_loss: list[int]
    out_of_loss: list[int]
    decisions: int
    loss: float


def update(net: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[Sample],
           clip: float = 0.2, epochs: int = 4) -> UpdateStats:
    import torch

    used = [s for s in batch if s.advantage is not None and s.decisions]
    stats = UpdateStats([s.seq for s in used], [s.seq for s in batch if s.advantage is None], 0, 0.0)
    if not used:
        return stats
    xs = torch.tensor([d.x for s in used for d in s.decisions], dtype=torch.float64)
    acts = torch.tensor([d.action for s in used for d in s.decisions], dtype=torch.int64)
    old = torch.tensor([d.logp for s in used for d in s.decisions], dtype=torch.float64)
    adv = torch.tensor([s.advantage for s in used for _ in s.decisions], dtype=torch.float64)
    stats.decisions = len(acts)
    if float(adv.abs().sum()) == 0.0:
        return stats
    for _ in range(epochs):
        logp = torch.log_softmax(net(xs), dim=-1).gather(1, acts[:, None]).squeeze(1)
        ratio = torch.exp(logp - old)
        loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stats.loss = float(loss.detach())
    return stats


__all__ = ["Sample", "UpdateStats", "torch_scratch", "update"]
