"""Business-day arithmetic on dates: Monday to Friday, except holidays."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date, timedelta

__all__ = ["add_business_days", "business_days_between", "is_business_day", "next_business_day"]

_DAY = timedelta(days=1)


def is_business_day(day: date, holidays: Collection[date] = ()) -> bool:
    """True if ``day`` is a weekday (Monday to Friday) and not one of ``holidays``."""
    return day.weekday() < 5 and day not in holidays


def business_days_between(start: date, end: date, holidays: Iterable[date] = ()) -> int:
    """Number of business days in the half-open range ``[start, end)``.

    ``start`` is counted and ``end`` is not, so from a Monday to the next Monday there are 5
    business days. If ``end`` is before ``start`` the result is negative.
    """
    closed = set(holidays)
    if end < start:
        return -business_days_between(end, start, closed)
    count = 0
    day = start
    while day < end:
        if is_business_day(day, closed):
            count += 1
        day += _DAY
    return count


def add_business_days(day: date, n: int, holidays: Iterable[date] = ()) -> date:
    """The date ``n`` business days after ``day`` (before it if ``n`` is negative).

    ``day`` itself need not be a business day; ``n == 0`` returns ``day`` unchanged.
    """
    closed = set(holidays)
    step = _DAY if n >= 0 else -_DAY
    remaining = abs(n)
    current = day
    while remaining:
        current += step
        if is_business_day(current, closed):
            remaining -= 1
    return current


def next_business_day(day: date, holidays: Iterable[date] = ()) -> date:
    """``day`` itself if it is a business day, otherwise the first business day after it."""
    closed = set(holidays)
    while not is_business_day(day, closed):
        day += _DAY
    return day
