"""Half-open time intervals ``[start, end)`` on a UTC time line.

Every datetime entering this module is normalized to UTC: aware datetimes are converted to
UTC, naive ones are taken to be in UTC already. Intervals therefore compare, merge and print
the same whatever offsets their inputs were written with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from intervals.duration import parse_duration

__all__ = ["Interval", "as_utc", "gaps", "merge", "total_duration"]


def as_utc(moment: datetime) -> datetime:
    """Return ``moment`` as an aware datetime in UTC (a naive ``moment`` is taken as UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Interval:
    """The half-open interval ``[start, end)``; ``start`` must not be after ``end``."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", as_utc(self.start))
        object.__setattr__(self, "end", as_utc(self.end))
        if self.end < self.start:
            raise ValueError(f"interval ends before it starts: {self}")

    @classmethod
    def parse(cls, text: str) -> Interval:
        """Parse an ISO 8601 interval: ``start/end``, ``start/duration`` or ``duration/end``."""
        first, sep, second = text.strip().partition("/")
        if not sep or not first or not second:
            raise ValueError(f"not an ISO 8601 interval: {text!r}")
        if first.lstrip("+-").startswith("P"):
            end = datetime.fromisoformat(second)
            return cls(end - parse_duration(first), end)
        start = datetime.fromisoformat(first)
        if second.lstrip("+-").startswith("P"):
            return cls(start, start + parse_duration(second))
        return cls(start, datetime.fromisoformat(second))

    def __str__(self) -> str:
        return f"{_iso(self.start)}/{_iso(self.end)}"

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    def __contains__(self, moment: datetime) -> bool:
        return self.start <= as_utc(moment) < self.end

    def overlaps(self, other: Interval) -> bool:
        """True if both intervals share an instant; intervals that merely touch do not."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The common part of both intervals, or ``None`` if they do not overlap."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return Interval(start, end) if start < end else None


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as a sorted list of disjoint intervals.

    Overlapping intervals, and intervals that touch (one ends where the next starts), are
    combined into one.
    """
    merged: list[Interval] = []
    for current in sorted(intervals, key=lambda iv: (iv.start, iv.end)):
        if merged and current.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, current.end))
        else:
            merged.append(current)
    return merged


def gaps(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of ``window`` not covered by any of ``intervals``, in order."""
    free: list[Interval] = []
    cursor = window.start
    for busy in merge(intervals):
        if busy.end <= cursor or busy.start >= window.end:
            continue
        if busy.start > cursor:
            free.append(Interval(cursor, busy.start))
        cursor = max(cursor, busy.end)
    if cursor < window.end:
        free.append(Interval(cursor, window.end))
    return free


def total_duration(intervals: Iterable[Interval]) -> timedelta:
    """Total time covered by ``intervals``, counting overlapping time once."""
    return sum((iv.duration for iv in merge(intervals)), timedelta(0))
