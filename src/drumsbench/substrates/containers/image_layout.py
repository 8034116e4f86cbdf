"""A built image's file system as its engine stores it: layer folders another overlay mount can share.

Docker's ``overlay2`` and podman's ``overlay`` storage drivers keep each image layer as a folder in
overlayfs's own format (whiteouts as 0/0 character devices, opaque folders as ``trusted.overlay``
xattrs): exactly the lower layers a container of the image is mounted from. ``image_layout`` reads
them, top first, from the engine's ``inspect`` answer, with the image's ``Env`` and ``User`` — what
the ``overlay`` and ``bwrap`` substrates need to run a task's image without exporting a copy.

The layers stay the engine's: removing the image (``docker rmi``, a prune) while a sandbox of it
lives takes its files away. Nothing here writes to them (overlayfs writes to the mount's upper).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.layer_mounts import mountable

DRIVERS = ("overlay2", "overlay")
ROOT_USERS = ("", "root", "0", "0:0", "root:root")


def is_root_user(user: str) -> bool:
    """Whether an image's ``USER`` (``Config.User``: "" when unset) names root."""
    return user in ROOT_USERS


@dataclass(frozen=True)
class ImageLayout:
    """``layers``: absolute folders, top first; ``env``: the image's ``ENV``; ``user``: its ``USER``
    ("" when unset)."""

    layers: tuple[str, ...]
    env: Mapping[str, str]
    user: str


def image_layout(engine: str, image: str, inspect: Mapping[str, Any]) -> ImageLayout:
    """The layout of ``image`` from the engine's ``image inspect`` record; ``SubstrateError`` when
    its storage driver keeps no overlay layers, or a layer folder is absent or unusable in a
    ``lowerdir`` option (a ``:``, ``,`` or ``\\`` in its path)."""
    driver = inspect.get("GraphDriver") or {}
    name = driver.get("Name")
    if name not in DRIVERS:
        raise SubstrateError(f"{engine}: image {image} is stored by the {name!r} driver; its layers can be "
                             f"shared only from {' or '.join(DRIVERS)}")
    data = driver.get("Data") or {}
    lower = data.get("LowerDir") or ""
    layers = tuple(p for p in (data.get("UpperDir") or "", *lower.split(":")) if p)
    if not layers:
        raise SubstrateError(f"{engine}: image {image} names no layer folders")
    for p in layers:
        if not os.path.isabs(p) or not os.path.isdir(p):
            raise SubstrateError(f"{engine}: image {image}'s layer folder {p!r} is absent")
        mountable(p, engine)
    cfg = inspect.get("Config") or {}
    env = dict(e.split("=", 1) for e in (cfg.get("Env") or []) if "=" in e)
    return ImageLayout(layers, env, str(cfg.get("User") or ""))
