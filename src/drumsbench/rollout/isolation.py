"""Isolation canaries (gate 6) and the positive control that proves the detector works.

Each sandbox gets a unique canary at reset, written into its home folder. After an episode the
sandbox is searched for any other sandbox's canary, and the host's shared temp folders for its
own. The positive control leaks one sandbox's canary into another on purpose and checks that the
detector fires; a run whose control did not fire reports its isolation figure as unconfirmed.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections import deque
from dataclasses import dataclass

from drumsbench.core.errors import SubstrateError
from drumsbench.core.host_places import shared_places
from drumsbench.substrates.base import HostFolders, HostLaunching, Sandbox, Substrate

CANARY_FILE = ".drumsbench-canary"


class CanaryRegistry:
    """Thread-safe registry of the run's canaries: live ones and the most recently retired.

    Only **live** canaries of other attempts are foreign (``others``): a retired one belonged to an
    attempt of the same run that has ended, and the run's policy could have stashed it then (in a
    place its next attempt reads, a container's ``/run/lock``) — finding it is no evidence of a
    failure of isolation."""

    def __init__(self, keep_retired: int = 64) -> None:
        self._live: dict[str, str] = {}
        self._retired: deque[str] = deque(maxlen=keep_retired)
        self._lock = threading.Lock()

    def issue(self, owner: str) -> str:
        token = f"DRUMSCANARY-{secrets.token_hex(8)}"
        with self._lock:
            self._live[token] = owner
        return token

    def retire(self, token: str) -> None:
        with self._lock:
            if self._live.pop(token, None) is not None:
                self._retired.append(token)

    def others(self, token: str) -> list[str]:
        """The live canaries of other attempts."""
        with self._lock:
            return [t for t in self._live if t != token]

    def retired(self) -> list[str]:
        """Canaries of ended attempts (most recent ``keep_retired``)."""
        with self._lock:
            return list(self._retired)


def plant(box: Sandbox, token: str) -> None:
    """Write the attempt's canary into the sandbox's home, before any action of the policy.

    Where the sandbox's commands run as a host uid of their own (``process``), the canary is made
    root's and unreadable to that uid: those sandboxes share the host's writable places, so a
    canary the policy could read could be handed by one attempt of the run to a concurrent one,
    which would then look contaminated (invalid) instead of failed. A canary no process of the
    policy can read can reach another sandbox only through the infrastructure."""
    path = f"{box.paths.home}/{CANARY_FILE}"
    box.write_file(path, token.encode())
    if isinstance(box, HostFolders) and isinstance(box, HostLaunching) and box.uid is not None:
        fd = os.open(box.host_path(path), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def shared_places_hits(token: str, places: tuple[str, ...] | None = None, max_files: int = 500) -> list[str]:
    """Files directly in the host's shared places (default: ``host_places.shared_places``) that
    contain ``token``."""
    hits = []
    needle = token.encode()
    for place in shared_places() if places is None else places:
        try:
            entries = list(os.scandir(place))[:max_files]
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat().st_size < (1 << 20):
                    # a file of another uid may be swapped for a fifo meanwhile: never wait on it
                    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with open(fd, "rb") as f:
                        if stat.S_ISREG(os.fstat(fd).st_mode) and needle in f.read(1 << 20):
                            hits.append(entry.path)
            except OSError:
                continue
    return hits


def contamination(box: Sandbox, folders: list[str], token: str, registry: CanaryRegistry) -> str | None:
    """What contaminated this sandbox, or None."""
    foreign = box.scan(folders, registry.others(token))
    if foreign:
        return f"other sandboxes' canaries found inside: {', '.join(sorted(foreign))}"
    leaked = shared_places_hits(token)
    if leaked:
        return f"this sandbox's canary found in shared places: {', '.join(leaked)}"
    return None


@dataclass(frozen=True)
class ControlResult:
    fired: bool
    detail: str


def positive_control(substrate: Substrate, tries: int = 2) -> ControlResult:
    """Leak sandbox A's canary into sandbox B; the detector must find it in B and nothing in A.

    A substrate failure during the control (a sandbox killed from outside, a daemon restarting) is
    tried again with new sandboxes, ``tries`` times in all; then the control is recorded as not fired,
    with the reason (the window is not confirmed), rather than stopping the run."""
    for i in range(tries):
        try:
            return _control_once(substrate)
        except SubstrateError as e:
            if i == tries - 1:
                return ControlResult(False, f"could not run: {e}"[:500])
    raise AssertionError("unreachable")


def _control_once(substrate: Substrate) -> ControlResult:
    registry = CanaryRegistry()
    a = substrate.create()
    try:
        b = substrate.create()
        try:
            ta, tb = registry.issue(a.id), registry.issue(b.id)
            plant(a, ta)
            plant(b, tb)
            b.write_file(f"{b.paths.tmp}/leaked-from-neighbour", ta.encode())
            folders_b = [b.paths.work, b.paths.home, b.paths.tmp]
            folders_a = [a.paths.work, a.paths.home, a.paths.tmp]
            in_b = contamination(b, folders_b, tb, registry)
            in_a = contamination(a, folders_a, ta, registry)
            fired = in_b is not None and ta in in_b and in_a is None
            detail = f"leak A->B detected: {in_b is not None}; clean A reported clean: {in_a is None}"
            return ControlResult(fired, detail)
        finally:
            b.destroy()
    finally:
        a.destroy()
