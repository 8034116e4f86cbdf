"""intervals: time intervals, ISO 8601 durations and business-day arithmetic.

Datetimes are handled on a UTC time line (see :mod:`intervals.interval`); business days are
plain :class:`datetime.date` values (see :mod:`intervals.business`).
"""

from intervals.business import (
    add_business_days,
    business_days_between,
    is_business_day,
    next_business_day,
)
from intervals.duration import format_duration, parse_duration
from intervals.interval import Interval, as_utc, gaps, merge, total_duration

__all__ = [
    "Interval",
    "add_business_days",
    "as_utc",
    "business_days_between",
    "format_duration",
    "gaps",
    "is_business_day",
    "merge",
    "next_business_day",
    "parse_duration",
    "total_duration",
]

__version__ = "2.0.1"
