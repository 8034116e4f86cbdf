"""ISO 8601 durations such as ``P1DT2H30M``, to and from :class:`datetime.timedelta`.

Weeks (``W``), days (``D``), hours (``H``), minutes (``M``) and seconds (``S``) are
supported; years and months are refused because their length varies. Any component may carry
a decimal fraction, written with ``.`` or ``,`` as ISO 8601 allows (``PT1,5H``), and the
whole duration may be negated with a leading ``-``.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_NUM = r"\d+(?:[.,]\d+)?"
_DURATION = re.compile(
    rf"(?P<sign>[-+])?P(?:(?P<weeks>{_NUM})W)?(?:(?P<days>{_NUM})D)?"
    rf"(?:T(?:(?P<hours>{_NUM})H)?(?:(?P<minutes>{_NUM})M)?(?:(?P<seconds>{_NUM})S)?)?"
)
_UNITS = ("weeks", "days", "hours", "minutes", "seconds")


def parse_duration(text: str) -> timedelta:
    """Parse an ISO 8601 duration such as ``"PT1H30M"``, ``"P2W"`` or ``"-P1DT12H"``.

    Raises ``ValueError`` for anything else, including ``"P"`` and ``"P1DT"``.
    """
    cleaned = text.strip()
    match = _DURATION.fullmatch(cleaned)
    if match is None or cleaned.endswith("T") or not any(match.group(u) for u in _UNITS):
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    parts = {u: float(match.group(u).replace(",", ".")) for u in _UNITS if match.group(u)}
    delta = timedelta(**parts)
    return -delta if match.group("sign") == "-" else delta


def format_duration(delta: timedelta) -> str:
    """Format ``delta`` as an ISO 8601 duration: ``"P1DT2H30M"``, ``"-PT45S"``, ``"PT0S"``.

    Negative durations get a leading ``-``; seconds keep up to six decimals. The result reads
    back unchanged with :func:`parse_duration`.
    """
    if delta < timedelta(0):
        return "-" + format_duration(-delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    date_part = f"{delta.days}D" if delta.days else ""
    time_part = ""
    if hours:
        time_part += f"{hours}H"
    if minutes:
        time_part += f"{minutes}M"
    if seconds or delta.microseconds:
        fraction = f"{delta.microseconds:06d}".rstrip("0")
        time_part += f"{seconds}.{fraction}S" if fraction else f"{seconds}S"
    if not date_part and not time_part:
        return "PT0S"
    return "P" + date_part + (f"T{time_part}" if time_part else "")
