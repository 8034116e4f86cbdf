"""The host's shared places: folders every user can write to and reach (``/tmp``, ``/var/tmp``,
``/dev/shm``, ``/run/lock``, and whatever else this host has).

A sandbox whose commands run as a host uid (the ``process`` substrate) can leave files there that
outlive it and that other sandboxes can read. So what a sandbox uid left in any of them goes with
the sandbox (``process.remove_owned_by``), and gate 6 looks there for a sandbox's own canary.

The list is found by walking the host's tree once per process (about 0.2 s): a folder counts when
it is writable by others and every folder above it is searchable by others (a world-writable
folder inside a folder the sandbox uid cannot enter, such as docker's layers under the 0710
``/var/lib/docker``, is out of its reach). ``/proc``, ``/sys`` and the sandboxes' own folders
(``/var/lib/drumsbench``) are not walked; nor are the
folders below a world-writable one (what a uid makes there is its own and removed with it), except
world-writable folders of another owner inside it (``/tmp/.X11-unix``).
"""

from __future__ import annotations

import functools
import os
import stat

# Always looked at, even where the walk does not reach them.
KNOWN = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# /var/lib/drumsbench: the sandboxes' own folders (their tmp is world-writable, and theirs alone)
NOT_WALKED = ("/proc", "/sys", "/var/lib/drumsbench")
MAX_DEPTH = 6


def world_writable(root: str = "/", skip: tuple[str, ...] = NOT_WALKED, max_depth: int = MAX_DEPTH) -> list[str]:
    """Folders under ``root`` writable by others whose every parent is searchable by others."""
    found: list[str] = []
    stack = [(root, 0, False)]
    while stack:
        path, depth, inside_shared = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    if entry.path in skip or not entry.is_dir(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not st.st_mode & stat.S_IXOTH:
                    continue
                shared = bool(st.st_mode & stat.S_IWOTH)
                if shared and not (inside_shared and st.st_uid != 0):
                    found.append(entry.path)
                # below a shared folder only root's folders are walked: a uid's own are its files
                if depth + 1 < max_depth and (not inside_shared or st.st_uid == 0):
                    stack.append((entry.path, depth + 1, inside_shared or shared))
    return found


@functools.cache
def shared_places() -> tuple[str, ...]:
    """The host's shared places (``KNOWN`` that exist, and the walk's), sorted; found once per process."""
    places = {p for p in KNOWN if os.path.isdir(p)} | set(world_writable())
    return tuple(sorted(places))
