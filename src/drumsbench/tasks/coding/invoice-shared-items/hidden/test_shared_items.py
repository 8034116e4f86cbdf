import unittest
from decimal import Decimal

from invoice.models import Invoice, LineItem


class SharedItemsTest(unittest.TestCase):
    def test_new_invoices_start_empty(self):
        first = Invoice("A-1", "Alice")
        first.add_item("Consulting", "2", "100.00")
        second = Invoice("A-2", "Bob")
        self.assertEqual(second.items, [])
        self.assertEqual(second.total, Decimal("0.00"))
        self.assertEqual(len(first.items), 1)

    def test_callers_list_is_not_modified(self):
        template = [LineItem("Base fee", Decimal("1"), Decimal("25.00"))]
        invoice = Invoice("B-1", "Carol", template)
        invoice.add_item("Extra", "1", "5.00")
        self.assertEqual(len(template), 1)
        self.assertEqual(len(invoice.items), 2)

    def test_invoices_from_one_template_are_independent(self):
        template = [LineItem("Base fee", Decimal("1"), Decimal("25.00"))]
        first = Invoice("C-1", "Dan", template)
        second = Invoice("C-2", "Eve", template)
        first.add_item("Extra", "1", "5.00")
        self.assertEqual(second.total, Decimal("25.00"))
        self.assertEqual(first.total, Decimal("30.00"))


if __name__ == "__main__":
    unittest.main()
