"""Substrate registry: built-ins plus plugins from the ``drumsbench.substrates`` entry-point group.

A plugin package declares ``[project.entry-points."drumsbench.substrates"] NAME = "pkg.mod:Class"``
where ``Class`` subclasses ``drumsbench.substrates.base.Substrate`` (see docs/adding-a-substrate.md).
The pattern is the one of every registry (``drumsbench.core.plugins``).
"""

from __future__ import annotations

from drumsbench.core.plugins import Registry
from drumsbench.substrates.base import Substrate

ENTRY_POINT_GROUP = "drumsbench.substrates"

# Built-ins are imported lazily so that a missing optional dependency (e.g. the docker SDK)
# only matters when that substrate is chosen.
BUILTINS: dict[str, str] = {
    "process": "drumsbench.substrates.process:ProcessSubstrate",
    "bwrap": "drumsbench.substrates.bwrap:BwrapSubstrate",
    "overlay": "drumsbench.substrates.overlay.sandbox:OverlaySubstrate",
    "docker": "drumsbench.substrates.containers.docker:DockerSubstrate",
    "podman": "drumsbench.substrates.containers.podman:PodmanSubstrate",
    "vm": "drumsbench.substrates.vm.sandbox:VmSubstrate",
}

SUBSTRATES: Registry[type[Substrate]] = Registry(
    "substrate", "--substrate", BUILTINS, ENTRY_POINT_GROUP,
    check=lambda obj: isinstance(obj, type) and issubclass(obj, Substrate), expected="a Substrate subclass")


def names() -> list[str]:
    return SUBSTRATES.names()


def get(name: str) -> type[Substrate]:
    """The substrate class called ``name``; ``UsageError`` naming the known ones otherwise."""
    return SUBSTRATES.load(name)


def having(capability: type, among: list[str] | None = None) -> list[str]:
    """Names of the substrates (of ``among``, else all: each one's module is imported) whose class
    has ``capability`` (a typed interface of ``substrates.base``, e.g. ``RecipeImages``); one that
    cannot be loaded here (an optional dependency missing, a broken plugin) is left out."""
    found = []
    for name in names() if among is None else among:
        try:
            cls = get(name)
        except Exception:  # not loadable here: not a fit
            continue
        if issubclass(cls, capability):
            found.append(name)
    return found
