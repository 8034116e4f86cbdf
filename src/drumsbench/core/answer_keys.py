"""Where the answer keys are on this host: folders no sandbox may see.

Hidden tests, golden and wrong patches and every verifier file live in task folders: the built-in
suites inside the installed package, any suite folder a run names and, when the package runs from
a source checkout, the checkout around it (its git objects hold every task too). A sandbox that can
read one of them can apply the golden patch and score success with nothing solved.

``harness_places()`` is the package's folder and the checkout around it; a run adds its suite's
folder (``experiments.run.make_substrate``: ``Substrate.hide``). Substrates whose sandboxes see the
host's file system cover these folders (``process``: its own mount view, ``own_view``, which also
covers every top-level folder that is not the system's, where other copies may lie; ``bwrap``: an
empty tmpfs over each).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import drumsbench

# The top-level host folders of the system, which sandboxes that see the host keep in sight (with
# the shared places in them); every other one (``/work``, ``/home``, ``/root``, ``/opt``, ``/srv``,
# ...) may hold checkouts and copies of task suites and is out of their sight.
SYSTEM_FOLDERS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin",
                            "sys", "tmp", "usr", "var"})


@functools.cache
def harness_places() -> tuple[Path, ...]:
    """The installed package's folder and, when it sits in a git checkout (or a virtual environment
    inside one), that checkout's top folder."""
    package = Path(os.path.realpath(Path(drumsbench.__file__).parent))
    places = [package]
    for parent in package.parents:
        if parent == Path("/"):
            break
        if (parent / ".git").exists():
            places.append(parent)
            break
    return tuple(places)
