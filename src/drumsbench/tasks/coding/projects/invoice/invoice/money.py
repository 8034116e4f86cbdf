"""Money amounts as :class:`~decimal.Decimal`: rounding, parsing, formatting, allocation.

Amounts are rounded to whole cents with halves rounded away from zero ("commercial
rounding"): 0.125 becomes 0.13 and -0.125 becomes -0.13.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

__all__ = ["CENT", "allocate", "format_money", "parse_money", "to_money"]

CENT = Decimal("0.01")

_PLAIN_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


def to_money(value: Decimal | int | str) -> Decimal:
    """Return ``value`` rounded to whole cents, halves away from zero.

    Floats are refused: most cent amounts have no exact float representation.
    """
    if isinstance(value, float):
        raise TypeError("money amounts must be Decimal, int or str, not float")
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


def parse_money(text: str, symbol: str = "$") -> Decimal:
    """Parse an amount such as ``"$1,234.50"``, ``"-$3.20"``, ``"1234.5"`` or ``"(12.00)"``.

    The currency ``symbol`` and thousands separators are optional; an amount in parentheses
    is negative (accounting style). Raises ``ValueError`` for anything else.
    """
    cleaned = text.strip()
    negative = False
    if cleaned.startswith("(") and cleaned.endswith(")"):
        negative, cleaned = True, cleaned[1:-1].strip()
    if cleaned.startswith("-"):
        negative, cleaned = not negative, cleaned[1:].lstrip()
    if symbol and cleaned.startswith(symbol):
        cleaned = cleaned[len(symbol) :].lstrip()
    cleaned = cleaned.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(cleaned):
        raise ValueError(f"not a money amount: {text!r}")
    try:
        amount = Decimal(cleaned)
    except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
        raise ValueError(f"not a money amount: {text!r}") from None
    return to_money(-amount if negative else amount)


def format_money(amount: Decimal | int | str, symbol: str = "$") -> str:
    """Format ``amount`` with thousands separators, e.g. ``"$1,234.50"`` or ``"-$3.20"``."""
    value = to_money(amount)
    sign = "-" if value < 0 else ""
    return f"{sign}{symbol}{abs(value):,.2f}"


def allocate(amount: Decimal | int | str, parts: int) -> list[Decimal]:
    """Split ``amount`` into ``parts`` cent amounts that add up to exactly ``amount``.

    The shares differ by at most one cent and the larger shares come first:
    ``allocate(Decimal("10.00"), 3)`` is ``[3.34, 3.33, 3.33]``.
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    cents = int(to_money(amount) * 100)
    base, remainder = divmod(cents, parts)
    return [Decimal(base + (1 if i < remainder else 0)).scaleb(-2) for i in range(parts)]
