"""The policy registry: ``--policy NAME[:ARG]`` -> a policy, through one factory per name.

Built-ins: ``oracle``, ``null``, ``noisy``, ``explorer`` (scripted), ``realistic`` (a coding agent on made
tasks), ``adversary[:STRATEGY,...]`` (the
red team) and ``endpoint:MODEL@URL`` (a model behind an OpenAI-compatible endpoint). Plugins add
factories through the ``drumsbench.policies`` entry-point group (the pattern of every registry:
``drumsbench.core.plugins``). A factory takes ``PolicyArgs`` and returns a fresh ``Policy``; a bad
argument is a one-line ``UsageError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drumsbench.core.plugins import Registry
from drumsbench.policies.scripted import Policy


@dataclass(frozen=True)
class PolicyArgs:
    """What a factory gets: the whole ``--policy`` value, its part after the first ``:`` (or
    ""), and the scripted policies' knobs."""

    spec: str
    arg: str
    noisy_p: float = 0.5
    explorer_steps: int = 20


Factory = Callable[[PolicyArgs], Policy]

POLICIES: Registry[Factory] = Registry(
    "policy", "--policy", {
        "oracle": "drumsbench.policies.scripted:oracle",
        "null": "drumsbench.policies.scripted:null",
        "noisy": "drumsbench.policies.scripted:noisy",
        "explorer": "drumsbench.policies.scripted:explorer",
        "adversary": "drumsbench.policies.adversary:factory",
        "endpoint": "drumsbench.policies.endpoint:factory",
        "realistic": "drumsbench.policies.realistic:factory",
    }, "drumsbench.policies", check=callable, expected="a policy factory (PolicyArgs -> Policy)")


def make_policy(spec: str, noisy_p: float = 0.5, explorer_steps: int = 20) -> Policy:
    """A fresh policy for ``--policy spec``; a one-line ``UsageError`` naming the known ones otherwise."""
    name, _, arg = spec.partition(":")
    return POLICIES.load(name)(PolicyArgs(spec, arg, noisy_p, explorer_steps))
