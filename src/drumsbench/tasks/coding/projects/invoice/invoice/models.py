"""Line items and invoices."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from invoice.money import to_money

__all__ = ["Invoice", "LineItem"]

ZERO = Decimal("0")
NO_MONEY = Decimal("0.00")


@dataclass
class LineItem:
    """One invoice line: ``quantity`` x ``unit_price``, less a discount, plus tax.

    ``tax_rate`` and ``discount`` are fractions (``Decimal("0.2")`` is 20 %). The discount is
    applied before tax is computed. Every derived amount is rounded to whole cents.
    """

    description: str
    quantity: Decimal
    unit_price: Decimal
    tax_rate: Decimal = ZERO
    discount: Decimal = ZERO

    def __post_init__(self) -> None:
        for name in ("quantity", "unit_price", "tax_rate", "discount"):
            value = getattr(self, name)
            if isinstance(value, float):
                raise TypeError(f"{name} must be Decimal, int or str, not float")
            setattr(self, name, Decimal(value))
        if self.quantity < 0:
            raise ValueError("quantity must not be negative")
        if self.tax_rate < 0:
            raise ValueError("tax_rate must not be negative")
        if not ZERO <= self.discount <= 1:
            raise ValueError("discount must be between 0 and 1")

    @property
    def subtotal(self) -> Decimal:
        """Quantity times unit price."""
        return to_money(self.quantity * self.unit_price)

    @property
    def discount_amount(self) -> Decimal:
        return to_money(self.subtotal * self.discount)

    @property
    def net(self) -> Decimal:
        """Subtotal less discount: the amount tax is charged on."""
        return self.subtotal - self.discount_amount

    @property
    def tax(self) -> Decimal:
        return to_money(self.net * self.tax_rate)

    @property
    def total(self) -> Decimal:
        return self.net + self.tax


class Invoice:
    """A numbered invoice for one customer.

    ``items`` (optional) are the initial line items; the invoice keeps its own copy of the
    list, so adding items to the invoice never changes the caller's list or another invoice.
    Payment is due ``terms_days`` after the ``issued`` date (today by default).
    """

    def __init__(
        self,
        number: str,
        customer: str,
        items: Iterable[LineItem] | None = None,
        issued: date | None = None,
        terms_days: int = 30,
    ) -> None:
        self.number = number
        self.customer = customer
        self.items: list[LineItem] = list(items) if items is not None else []
        self.issued = issued if issued is not None else date.today()
        self.terms_days = terms_days

    def add_item(
        self,
        description: str,
        quantity: Decimal | int | str,
        unit_price: Decimal | int | str,
        tax_rate: Decimal | int | str = ZERO,
        discount: Decimal | int | str = ZERO,
    ) -> LineItem:
        """Append a new line item and return it."""
        # LineItem converts str and int amounts to Decimal (and refuses floats).
        item = LineItem(description, quantity, unit_price, tax_rate, discount)  # type: ignore
        self.items.append(item)
        return item

    @property
    def subtotal(self) -> Decimal:
        return sum((item.subtotal for item in self.items), NO_MONEY)

    @property
    def discount_total(self) -> Decimal:
        return sum((item.discount_amount for item in self.items), NO_MONEY)

    @property
    def tax_total(self) -> Decimal:
        return sum((item.tax for item in self.items), NO_MONEY)

    @property
    def total(self) -> Decimal:
        return sum((item.total for item in self.items), NO_MONEY)

    def tax_breakdown(self) -> dict[Decimal, Decimal]:
        """Tax charged per tax rate, as ``{rate: tax}`` ordered by rate."""
        per_rate: dict[Decimal, Decimal] = {}
        for item in self.items:
            per_rate[item.tax_rate] = per_rate.get(item.tax_rate, NO_MONEY) + item.tax
        return dict(sorted(per_rate.items()))

    @property
    def due_date(self) -> date:
        return self.issued + timedelta(days=self.terms_days)

    def is_overdue(self, today: date) -> bool:
        """True once ``today`` is past the due date (paying on the due date is in time)."""
        return today > self.due_date
