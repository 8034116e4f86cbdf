"""A training-side loop against ``drumsbench serve`` with OpenEnv's own client, dropping invalid
episodes before they reach the loss (docs/serve.md).

    .venv/bin/drumsbench serve --port 8000 --max-sessions 8 &
    .venv/bin/python examples/openenv_training_loop.py --url http://127.0.0.1:8000 --groups 2 --group-size 4

Each group is ``group_size`` episodes of one task (GRPO-style). An invalid episode (``valid`` false on
its final observation: an infrastructure fault, reward null) is removed from its group *before*
the group's mean and standard deviation are computed — masking only its loss would still let its
reward distort its siblings' advantages. A group left with fewer than two valid episodes is skipped.

The policy here is a stand-in (it solves with probability ``p`` using the task's known fix and
otherwise submits at once); a trainer puts its model's sampling in ``act``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from openenv.core.generic_client import GenericEnvClient


@dataclass
class Episode:
    task: str
    actions: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    valid: bool = False
    outcome: str | None = None
    cause: str | None = None


def stand_in_policy(p: float, seed: int, stale: float = 0.0):
    """``act(observation, step, key) -> action``: a scripted stand-in for a model. ``stale``: the share
    of episodes whose first action carries an old generation, as a faulty transport would deliver it
    (the server makes that attempt invalid: ``stale_generation``) — to see the drop at work."""
    from drumsbench.envs.coding.task import load_suite

    plans = {t.id: t.oracle_plan() for t in load_suite("coding")}
    draws: dict[int, tuple[bool, bool]] = {}  # per episode: (solve, stale); independent of the order

    def act(obs: dict[str, Any], step: int, key: int) -> dict[str, Any]:
        if key not in draws:
            rng = random.Random(f"{seed}:{key}")
            draws[key] = (rng.random() < p, rng.random() < stale)
        solve, late = draws[key]
        plan = plans[obs["task"]] if solve else []
        spec = plan[step] if step < len(plan) else None
        action = {"kind": spec.kind, **spec.payload} if spec else {"kind": "submit"}
        # echo the observation's generation: the server checks it
        return {**action, "generation": obs["generation"] - (late and step == 0)}

    return act


async def run_episode(url: str, task: str, act, key: int, client: str) -> Episode:
    ep = Episode(task)
    async with GenericEnvClient(base_url=url) as env:
        result = await env.reset(task=task, client=client)
        step = 0
        while not result.done:
            action = act(result.observation, step, key)
            ep.actions.append(action)
            result = await env.step(action)
            step += 1
        obs = result.observation
        ep.reward, ep.valid, ep.outcome, ep.cause = result.reward, bool(obs["valid"]), obs["outcome"], obs["cause"]
    return ep


def advantages(group: list[Episode]) -> list[tuple[Episode, float]]:
    """Group-relative advantages over the valid episodes only; invalid ones never enter."""
    valid = [e for e in group if e.valid]
    if len(valid) < 2:
        return []
    rewards = [float(e.reward) for e in valid]  # type: ignore[arg-type]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(e, (float(e.reward) - mean) / (std + 1e-6)) for e in valid]  # type: ignore[arg-type]


async def collect(url: str, tasks: list[str], group_size: int, p: float = 0.5, seed: int = 0,
                  client: str = "example-trainer", stale: float = 0.0) -> dict[str, Any]:
    act = stand_in_policy(p, seed, stale)
    batch: list[tuple[Episode, float]] = []
    dropped: list[Episode] = []
    for g, task in enumerate(tasks):
        group = await asyncio.gather(*(run_episode(url, task, act, g * group_size + i, client)
                                       for i in range(group_size)))
        dropped += [e for e in group if not e.valid]
        batch += advantages(list(group))
    return {"batch": len(batch), "dropped_invalid": len(dropped),
            "dropped_causes": sorted({e.cause for e in dropped if e.cause}),
            "mean_reward_valid": statistics.fmean([float(e.reward) for e, _ in batch]) if batch else None,
            "advantages": [round(a, 3) for _, a in batch]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--p", type=float, default=0.5, help="stand-in policy: probability of solving")
    ap.add_argument("--stale", type=float, default=0.0, help="share of episodes sent with an old generation")
    args = ap.parse_args()
    from drumsbench.envs.coding.task import load_suite

    tasks = [t.id for t in load_suite("coding")][: args.groups]
    print(json.dumps(asyncio.run(collect(args.url, tasks, args.group_size, args.p, stale=args.stale)), indent=2))


if __name__ == "__main__":
    main()
