"""What the substrates that mount overlayfs themselves (``overlay``, ``bwrap`` on task images) share.

- ``make_skeleton``: the layer every sandbox root has on top of its image — ``sandbox/{work,home,tmp,
  verify}`` — made once per run, atomically (two threads may race; one rename wins);
- ``mountable``: a path as it may appear in an overlay mount's ``lowerdir``/``upperdir`` option
  (``SubstrateError`` for a ``:``, ``,`` or ``\\``, which the option syntax cannot carry);
- ``FLOOR_MOUNT``: the shell a hand-written harness runs for one overlay root (the raw floor the
  substrates' overheads are measured against): a tmpfs over ``/mnt`` holding upper and work folders,
  an overlay of ``$1`` (the lower layers) mounted at ``/mnt/m``. Run in a private mount namespace,
  everything goes with it.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates.base import SANDBOX_FOLDERS

FLOOR_MOUNT = (
    'd=/mnt && mount -t tmpfs floor "$d" && mkdir "$d/u" "$d/w" "$d/m" && '
    'mount -t overlay overlay -o "lowerdir=$1,upperdir=$d/u,workdir=$d/w" "$d/m"'
)


def mountable(path: str, owner: str) -> str:
    """``path`` unchanged, or ``SubstrateError`` (naming substrate ``owner``) when an overlay mount
    option cannot carry it."""
    if any(c in path for c in ":,\\"):
        raise SubstrateError(f"{owner}: the path {path!r} has ':', ',' or '\\' (unusable in an overlay mount)")
    return path


def make_skeleton(skel: Path) -> Path:
    """Folder ``skel`` holding ``sandbox/{work,home,tmp,verify}`` (``tmp`` 1777), made once; returns it."""
    if not skel.is_dir():
        skel.parent.mkdir(parents=True, exist_ok=True)
        tmp = skel.parent / f".skel-{uuid.uuid4().hex[:6]}"
        for sub in SANDBOX_FOLDERS:
            (tmp / "sandbox" / sub).mkdir(parents=True)
        (tmp / "sandbox" / "tmp").chmod(0o1777)
        try:
            tmp.rename(skel)
        except OSError:  # made meanwhile by another thread
            shutil.rmtree(tmp, ignore_errors=True)
    return skel
