"""CSV export and import of an invoice's line items."""

from __future__ import annotations

import csv
import io
from decimal import Decimal, InvalidOperation

from invoice.models import Invoice, LineItem

__all__ = ["FIELDS", "from_csv", "to_csv"]

FIELDS = ("description", "quantity", "unit_price", "tax_rate", "discount", "total")


def to_csv(invoice: Invoice) -> str:
    """The line items of ``invoice`` as CSV text with a header row (``FIELDS``).

    Numbers are written exactly as stored, so that :func:`from_csv` restores the same items.
    The ``total`` column is informational: it is recomputed on import.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIELDS)
    for item in invoice.items:
        writer.writerow(
            [
                item.description,
                str(item.quantity),
                str(item.unit_price),
                str(item.tax_rate),
                str(item.discount),
                str(item.total),
            ]
        )
    return buffer.getvalue()


def from_csv(text: str, number: str, customer: str) -> Invoice:
    """Build an invoice from CSV text in the format :func:`to_csv` writes.

    ``tax_rate``, ``discount`` and ``total`` may be missing. Raises ``ValueError`` naming
    the line of the first malformed row.
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = {"description", "quantity", "unit_price"} - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"missing columns: {', '.join(sorted(missing))}")
    items = []
    for line, row in enumerate(reader, start=2):
        try:
            items.append(
                LineItem(
                    row["description"],
                    quantity=Decimal(row["quantity"]),
                    unit_price=Decimal(row["unit_price"]),
                    tax_rate=Decimal(row.get("tax_rate") or "0"),
                    discount=Decimal(row.get("discount") or "0"),
                )
            )
        except (InvalidOperation, TypeError, ValueError) as exc:
            raise ValueError(f"line {line}: invalid row {row!r}") from exc
    return Invoice(number, customer, items)
