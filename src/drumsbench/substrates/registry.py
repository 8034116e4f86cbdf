"""Substrate registry: built-ins plus plugins from the ``drumsbench.substrates`` entry-point group.

A plugin package declares ``[project.entry-points."drumsbench.substrates"] NAME = "pkg.mod:Class"``
where ``Class`` subclasses ``drumsbench.substrates.base.Substrate``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from drumsbench.errors import UsageError
from drumsbench.substrates.base import Substrate

ENTRY_POINT_GROUP = "drumsbench.substrates"

# Built-ins are imported lazily so that a missing optional dependency (e.g. the docker SDK)
# only matters when that substrate is chosen.
BUILTINS: dict[str, str] = {
    "process": "drumsbench.substrates.process:ProcessSubstrate",
    "bwrap": "drumsbench.substrates.bwrap:BwrapSubstrate",
    "overlay": "drumsbench.substrates.overlay:OverlaySubstrate",
    "docker": "drumsbench.substrates.docker:DockerSubstrate",
    "podman": "drumsbench.substrates.podman:PodmanSubstrate",
}


def _load(spec: str) -> type[Substrate]:
    module, _, attr = spec.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Substrate)):
        raise TypeError(f"{spec} is not a Substrate subclass")
    return cls


def names() -> list[str]:
    plugins = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(BUILTINS) + [n for n in plugins if n not in BUILTINS]


def get(name: str) -> type[Substrate]:
    """The substrate class called ``name``; ``UsageError`` naming the known ones otherwise."""
    if name in BUILTINS:
        return _load(BUILTINS[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Substrate)):
                raise UsageError(f"substrate plugin {name!r} ({ep.value}) is not a Substrate subclass")
            return cls
    raise UsageError(f"--substrate: unknown substrate {name!r}; choose one of: {', '.join(names())}")
