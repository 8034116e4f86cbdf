"""Warm pools: sandboxes created ahead of demand, checked clean, handed out; generic over ``Substrate``.

``WarmPool(substrate, size)`` keeps up to ``size`` idle sandboxes of one substrate. A background
thread creates them, checks each one (``check_fresh``: the start-state gate of a fresh sandbox) and
puts the clean ones in the pool; ``acquire()`` hands one out and wakes the thread to make a
replacement. ``pooled(substrate, size)`` wraps a substrate so that its ``create()`` acquires from a
pool: every experiment (run, sweep, project, the positive control) uses it without knowing.

Contracts:

- **Never hands out a sandbox that failed its check.** A sandbox is checked after it is created; an
  idle one is checked again in the background when its check is older than ``recheck_s``; and at
  ``acquire`` it is checked once more, synchronously, when the substrate's check is cheap (the
  fastest check this pool has seen took at most ``cheap_check_s``: a host-side digest, e.g.
  process, bwrap, overlay, ~0.3-2 ms; the minimum, so that a loaded host does not turn it off) or
  when it is stale (older than ``recheck_s``: the background check lagged). A sandbox that fails
  is destroyed (``refused``), never handed out,
  and replaced. Where the check is an exec (docker, podman: 60–200 ms), a sandbox changed from the
  host after its last check and before ``acquire`` is not seen by the pool; it is caught by the
  attempt's own gate 1 (``dirty_reset``), as without a pool — that window is at most ``recheck_s``.
- **Pool empty** (demand faster than refill): ``acquire`` creates and checks a sandbox itself
  (a *miss*, counted); it never waits for the background thread.
- **Nothing leaks.** Every pooled sandbox is the substrate's own, labelled with the run id, so
  ``leftovers()`` lists it and ``gc`` removes it after a crash; ``close()`` stops the thread and
  destroys every idle sandbox (and one being created at that moment).
- The idle reserve is measured (``use()``: sandbox-seconds held idle, seconds of creating, checking
  and destroying in the background), so its cost is attributed from what the pool really held
  (``measure.cost.attribute``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from drumsbench.core.errors import SubstrateError, UsageError
from drumsbench.core.fingerprint import UNREADABLE_MARK
from drumsbench.measure.cost import PoolUse
from drumsbench.substrates.base import (
    SANDBOX_FOLDERS,
    Forking,
    ImageFlavors,
    ImageRecipe,
    PortableSnapshots,
    RecipeImages,
    Sandbox,
    SandboxLimits,
    Substrate,
)

# --pool: "auto" = one idle sandbox per concurrent attempt; "off" = no pool; N = N idle sandboxes
PoolSetting = int | Literal["auto"]
DEFAULT_POOL: PoolSetting = "auto"
RECHECK_S = 10.0  # an idle sandbox is checked again in the background when its check is older
CHEAP_CHECK_S = 0.005  # a check at most this long is repeated at every acquire
MAX_POOL = 512


def parse_pool(text: str | int | None, flag: str = "--pool") -> PoolSetting:
    """``auto``, ``off`` (0) or a whole number 0..512; one-line ``UsageError`` otherwise."""
    if text is None:
        return DEFAULT_POOL
    if isinstance(text, int):
        n = text
    else:
        t = text.strip().lower()
        if t == "auto":
            return "auto"
        if t in ("off", "none", "no"):
            return 0
        try:
            n = int(t)
        except ValueError:
            raise UsageError(f"{flag}: {text!r} is not auto, off or a number of sandboxes, e.g. {flag} 4") from None
    if not 0 <= n <= MAX_POOL:
        raise UsageError(f"{flag}: {n} is out of range; give 0 (off) to {MAX_POOL}, auto or off")
    return n


def pool_size(setting: PoolSetting, concurrency: int) -> int:
    """Idle sandboxes to keep: ``auto`` follows concurrency (one per concurrent attempt)."""
    return concurrency if setting == "auto" else int(setting)


def fresh_digest(folders: tuple[str, ...] = SANDBOX_FOLDERS) -> str:
    """The start fingerprint of a fresh sandbox: its root holds exactly the empty folders."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(folders):
        h.update(b"D " + name.encode() + b"\n")
    return "sha256:" + h.hexdigest()


FRESH = fresh_digest()


def check_fresh(box: Sandbox) -> str | None:
    """Gate 1 for a fresh sandbox: its root digests (``Sandbox.tree_digest``, the start-state
    fingerprint) to the four empty folders and nothing else. ``None`` when clean, else why not (an
    unreadable entry is not clean either; a substrate error is a failed check)."""
    try:
        got = box.tree_digest(box.paths.root)
    except SubstrateError as e:
        return f"{'unreadable entry' if UNREADABLE_MARK in str(e) else 'check failed'}: {e}"[:300]
    except OSError as e:  # UnreadableEntry from a host-side digest
        return f"unreadable: {e}"[:300]
    except Exception as e:  # anything else the substrate raised: not shown clean
        return f"check failed: {type(e).__name__}: {e}"[:300]
    if got != FRESH:
        return f"not fresh: its root digests to {got[:19]}..., a fresh sandbox to {FRESH[:19]}..."
    return None


@dataclass
class _Idle:
    box: Sandbox
    checked_at: float
    check_s: float


class WarmPool:
    """Up to ``size`` idle, checked sandboxes of ``substrate``; see the module docstring."""

    def __init__(self, substrate: Substrate, size: int, *, recheck_s: float = RECHECK_S,
                 cheap_check_s: float = CHEAP_CHECK_S, start: bool = True) -> None:
        if size < 1:
            raise ValueError("a pool holds at least one sandbox")
        self.substrate, self.size = substrate, size
        self.recheck_s, self.cheap_check_s = recheck_s, cheap_check_s
        self._idle: deque[_Idle] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._making = 0  # sandboxes the thread is making (not yet in the deque)
        self._rechecking = 0  # idle sandboxes out of the deque for their background recheck (still the pool's)
        self._trash: list[Sandbox] = []
        self._last_t = time.monotonic()
        self._held_s = 0.0
        self.u = PoolUse(size=size)
        self._min_check_s = float("inf")  # the cheapest check seen: a property of the substrate, not of the load
        self.refusals: list[str] = []
        self._thread = threading.Thread(target=self._loop, name=f"pool-{substrate.name}", daemon=True)
        if start:
            self._thread.start()

    # -- bookkeeping (under the lock) -------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        self._held_s += (len(self._idle) + self._rechecking) * (now - self._last_t)
        self._last_t = now

    def _refuse(self, box: Sandbox, why: str) -> None:
        self.u.refused += 1
        self.refusals.append(f"{box.describe()}: {why}")
        self._trash.append(box)

    # -- the background thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                trash, self._trash = self._trash, []
            for box in trash:
                self._destroy(box)
            with self._cv:
                if self._closed:
                    return
                job: Literal["make", "recheck", "wait"] = "wait"
                item: _Idle | None = None
                if len(self._idle) + self._making + self._rechecking < self.size:
                    job = "make"
                    self._making += 1
                else:
                    now = time.monotonic()
                    stale = [i for i in self._idle if now - i.checked_at > self.recheck_s / 2]
                    if stale:
                        item = min(stale, key=lambda i: i.checked_at)
                        self._tick()
                        self._idle.remove(item)
                        self._rechecking += 1
                        job = "recheck"
                if job == "wait":
                    if not self._trash:
                        self._cv.wait(timeout=self.recheck_s / 4)
                    continue
            try:
                if job == "make":
                    self._make()
                elif item is not None:
                    self._recheck(item)
            finally:
                with self._cv:
                    if job == "make":
                        self._making -= 1
                    self._cv.notify_all()

    def _make(self) -> None:
        t0 = time.monotonic()
        try:
            box = self.substrate.create()
        except Exception as e:  # a failed create is retried after a pause; the run's own create reports it
            with self._cv:
                self.u.create_failures += 1
                self.refusals.append(f"create failed: {e}"[:300])
                self._cv.wait(timeout=1.0)
            return
        self.u.create_s += time.monotonic() - t0
        self.u.created += 1
        self._admit(box)

    def _recheck(self, item: _Idle) -> None:
        self._admit(item.box, rechecked=True)

    def _admit(self, box: Sandbox, rechecked: bool = False) -> None:
        t0 = time.monotonic()
        why = check_fresh(box)
        dt = time.monotonic() - t0
        with self._cv:
            self._tick()
            self._min_check_s = min(self._min_check_s, dt)
            self.u.checks += 1
            self.u.check_s += dt
            if rechecked:
                self.u.rechecks += 1
                self._rechecking -= 1
            if why is not None:
                self._refuse(box, why)
            elif self._closed:
                self._trash.append(box)
            else:
                self._tick()
                self._idle.append(_Idle(box, time.monotonic(), dt))
            self._cv.notify_all()
        if self._closed:
            self._drain_trash()

    def _destroy(self, box: Sandbox) -> None:
        t0 = time.monotonic()
        try:
            box.destroy()
        except Exception as e:
            self.refusals.append(f"destroy of {box.describe()} failed: {e}"[:300])
        self.u.destroy_s += time.monotonic() - t0

    def _drain_trash(self) -> None:
        with self._cv:
            trash, self._trash = self._trash, []
        for box in trash:
            self._destroy(box)

    # -- the caller's side -------------------------------------------------------------------------
    def acquire(self) -> Sandbox:
        """A checked, clean sandbox: from the pool (a *hit*) or, when it is empty, made here (a *miss*).

        ``SubstrateError`` when the pool is closed or a sandbox made here fails its check."""
        t0 = time.monotonic()
        while True:
            with self._cv:
                if self._closed:
                    raise SubstrateError(f"{self.substrate.name}: the warm pool is closed")
                if not self._idle:
                    break
                self._tick()
                item = self._idle.pop()  # the most recently checked
                self._cv.notify_all()  # the thread makes a replacement
            if self._min_check_s <= self.cheap_check_s or time.monotonic() - item.checked_at > self.recheck_s:
                c0 = time.monotonic()
                why = check_fresh(item.box)
                with self._cv:
                    self.u.checks += 1
                    self.u.acquire_checks += 1
                    self.u.check_s += time.monotonic() - c0
                    if why is not None:
                        self._refuse(item.box, why)
                        self._cv.notify_all()
                        continue
            with self._cv:
                self.u.hits += 1
                self.u.acquire_s += time.monotonic() - t0
            return item.box
        box = self.substrate.create()
        why = check_fresh(box)
        with self._cv:
            self.u.misses += 1
            self.u.acquire_s += time.monotonic() - t0
            if why is not None:
                self._refuse(box, why)
                self._cv.notify_all()
        if why is not None:
            raise SubstrateError(f"{self.substrate.name}: a new sandbox failed its start check: {why}")
        return box

    def idle(self) -> int:
        with self._cv:
            return len(self._idle)

    def idle_sandboxes(self) -> list[Sandbox]:
        """The idle sandboxes in the pool now, not counting one being rechecked (a copy, for
        inspection; they stay the pool's)."""
        with self._cv:
            return [i.box for i in self._idle]

    def _full(self) -> bool:
        return len(self._idle) + self._rechecking >= self.size

    def wait_full(self, timeout: float) -> bool:
        """Wait until ``size`` checked sandboxes are idle (one being rechecked in the background counts:
        it stays the pool's) or ``timeout``; returns whether it is full."""
        end = time.monotonic() + timeout
        with self._cv:
            while not self._full() and not self._closed:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(timeout=min(left, 0.5))
            return self._full()

    def wait_for(self, what: Callable[[PoolUse], bool], timeout: float) -> bool:
        """Wait until ``what(self.use())`` holds (tests, measurements)."""
        end = time.monotonic() + timeout
        with self._cv:
            while not what(self.use_locked()):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(timeout=min(left, 0.2))
            return True

    def use_locked(self) -> PoolUse:
        self._tick()
        return self.u.model_copy(update={"idle_sandbox_s": self._held_s, "idle_now": len(self._idle)})

    def use(self) -> PoolUse:
        """What the pool held and did so far (a copy)."""
        with self._cv:
            return self.use_locked()

    def close(self) -> PoolUse:
        """Stop the thread, destroy every idle sandbox; returns the final ``use()``. Idempotent."""
        with self._cv:
            first = not self._closed
            self._closed = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        with self._cv:
            self._tick()
            boxes = [i.box for i in self._idle] + self._trash
            self._idle.clear()
            self._trash = []
        for box in boxes:
            self._destroy(box)
        if first:
            self.u.closed_destroyed = len(boxes)
        return self.use()


class PooledSubstrate(Substrate):
    """A substrate whose ``create()`` acquires from a ``WarmPool`` of another; everything else is the
    other's (name, capabilities, sandbox class, leftovers, gc, raw floor). Made by ``pooled``."""

    inner: Substrate
    pool: WarmPool
    name: ClassVar[str] = "pooled"

    def __init__(self, inner: Substrate, pool: WarmPool) -> None:
        super().__init__(inner.run_id, inner.state_dir)
        self.inner, self.pool = inner, pool
        self.capabilities = inner.capabilities

    @classmethod
    def missing(cls) -> str | None:
        return None

    def create(self) -> Sandbox:
        return self.pool.acquire()

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self.inner.close()

    def raw_floor(self) -> list[str] | None:
        return self.inner.raw_floor()

    def limit_mechanisms(self) -> dict[str, str]:
        return self.inner.limit_mechanisms()

    def leftovers(self) -> list[str]:
        return self.inner.leftovers()


class _ForkingOfInner(Forking):
    """``Forking`` of a pooled substrate: forks are the inner substrate's, never pooled."""

    inner: Substrate

    def fork(self, snapshot_id: str) -> Sandbox:
        assert isinstance(self.inner, Forking)
        return self.inner.fork(snapshot_id)

    def snapshots(self) -> list[str]:
        assert isinstance(self.inner, Forking)
        return self.inner.snapshots()

    def drop_snapshot(self, snapshot_id: str) -> None:
        assert isinstance(self.inner, Forking)
        self.inner.drop_snapshot(snapshot_id)


class _PortableOfInner(PortableSnapshots):
    """``PortableSnapshots`` of a pooled substrate: the inner substrate's snapshots, as bytes."""

    inner: Substrate

    def export_snapshot(self, snapshot_id: str) -> bytes:
        assert isinstance(self.inner, PortableSnapshots)
        return self.inner.export_snapshot(snapshot_id)

    def import_snapshot(self, data: bytes) -> str:
        assert isinstance(self.inner, PortableSnapshots)
        return self.inner.import_snapshot(data)


class _RecipesOfInner(RecipeImages):
    """``RecipeImages`` of a pooled substrate: the inner substrate builds (an image touches no sandbox)
    and makes the sandboxes of a task image (the pool's idle sandboxes are of the default image)."""

    inner: Substrate

    def build_recipe(self, recipe: ImageRecipe) -> str:
        assert isinstance(self.inner, RecipeImages)
        return self.inner.build_recipe(recipe)

    def create_from_image(self, image: str, limits: SandboxLimits | None = None) -> Sandbox:
        assert isinstance(self.inner, RecipeImages)
        return self.inner.create_from_image(image, limits)

    def raw_floor_of(self, image: str) -> list[str] | None:
        assert isinstance(self.inner, RecipeImages)
        return self.inner.raw_floor_of(image)


# Each substrate-level capability (a typed interface of ``substrates/base.py`` a Substrate class may
# implement) is forwarded by a pooled substrate whose inner one has it, or named here with why not;
# tests/test_pool.py fails on a capability in neither.
FORWARDED: dict[type, type] = {Forking: _ForkingOfInner, PortableSnapshots: _PortableOfInner,
                               RecipeImages: _RecipesOfInner}
NOT_FORWARDED: dict[type, str] = {
    ImageFlavors: "the flavor is chosen before the pool is filled (with_flavor, then pooled): the pool's "
                  "sandboxes are made already",
}

_CLASSES: dict[type[Substrate], type[PooledSubstrate]] = {}


def pooled_class(cls: type[Substrate]) -> type[PooledSubstrate]:
    """The class of a pooled ``cls``: ``PooledSubstrate`` plus the forwarding of every capability
    of ``FORWARDED`` that ``cls`` has, with its name, sandbox class, capabilities, ``missing`` and
    ``gc`` (made once per class)."""
    made = _CLASSES.get(cls)
    if made is None:
        bases = (PooledSubstrate, *(fwd for cap, fwd in FORWARDED.items() if issubclass(cls, cap)))
        made = type(f"Pooled{cls.__name__}", bases, {
            "name": cls.name, "sandbox_class": cls.sandbox_class, "capabilities": cls.capabilities,
            "missing": classmethod(lambda _c: cls.missing()),
            "gc": classmethod(lambda _c, state_dir, dead: cls.gc(state_dir, dead)),
        })
        _CLASSES[cls] = made
    return made


def pooled(inner: Substrate, size: int, **kw: Any) -> PooledSubstrate:
    """``inner`` behind a warm pool of ``size`` (starts filling now). ``close()`` closes both."""
    return pooled_class(type(inner))(inner, WarmPool(inner, size, **kw))
