import unittest
from datetime import date
from decimal import Decimal

from invoice.models import Invoice, LineItem


class LineItemTest(unittest.TestCase):
    def test_amounts(self):
        item = LineItem("Widget", Decimal("3"), Decimal("19.99"), Decimal("0.2"), Decimal("0.1"))
        self.assertEqual(item.subtotal, Decimal("59.97"))
        self.assertEqual(item.discount_amount, Decimal("6.00"))
        self.assertEqual(item.net, Decimal("53.97"))
        self.assertEqual(item.tax, Decimal("10.79"))
        self.assertEqual(item.total, Decimal("64.76"))

    def test_validation(self):
        with self.assertRaises(ValueError):
            LineItem("Bad", Decimal("-1"), Decimal("1"))
        with self.assertRaises(ValueError):
            LineItem("Bad", Decimal("1"), Decimal("1"), discount=Decimal("1.5"))
        with self.assertRaises(TypeError):
            LineItem("Bad", 1.5, Decimal("1"))


class InvoiceTest(unittest.TestCase):
    def test_totals(self):
        items = [
            LineItem("Consulting", Decimal("10"), Decimal("120.00"), Decimal("0.2")),
            LineItem("Travel", Decimal("1"), Decimal("80.00")),
        ]
        invoice = Invoice("2024-001", "ACME", items, issued=date(2024, 1, 31))
        self.assertEqual(invoice.subtotal, Decimal("1280.00"))
        self.assertEqual(invoice.tax_total, Decimal("240.00"))
        self.assertEqual(invoice.total, Decimal("1520.00"))
        self.assertEqual(
            invoice.tax_breakdown(),
            {Decimal("0"): Decimal("0.00"), Decimal("0.2"): Decimal("240.00")},
        )

    def test_add_item(self):
        invoice = Invoice("2024-003", "ACME", [LineItem("Base fee", Decimal("1"), Decimal("50"))])
        item = invoice.add_item("Extra", "2", "12.50", discount="0.2")
        self.assertEqual(item.total, Decimal("20.00"))
        self.assertEqual(invoice.total, Decimal("70.00"))

    def test_due_date(self):
        invoice = Invoice("2024-002", "ACME", [], issued=date(2024, 1, 31), terms_days=14)
        self.assertEqual(invoice.due_date, date(2024, 2, 14))
        self.assertFalse(invoice.is_overdue(date(2024, 2, 14)))
        self.assertTrue(invoice.is_overdue(date(2024, 2, 15)))


if __name__ == "__main__":
    unittest.main()
