"""invoice: line items, invoices and money arithmetic with :class:`decimal.Decimal`.

Amounts are rounded to whole cents with halves rounded away from zero; floats are refused
wherever money enters the package.
"""

from invoice.export import from_csv, to_csv
from invoice.models import Invoice, LineItem
from invoice.money import CENT, allocate, format_money, parse_money, to_money

__all__ = [
    "CENT",
    "Invoice",
    "LineItem",
    "allocate",
    "format_money",
    "from_csv",
    "parse_money",
    "to_csv",
    "to_money",
]

__version__ = "0.9.2"
