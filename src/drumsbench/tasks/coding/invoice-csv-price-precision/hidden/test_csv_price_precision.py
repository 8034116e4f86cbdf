import csv
import io
import unittest
from decimal import Decimal

from invoice.export import from_csv, to_csv
from invoice.models import Invoice, LineItem


def round_trip(*items):
    invoice = Invoice("P-1", "Pat", list(items))
    text = to_csv(invoice)
    return invoice, text, from_csv(text, "P-2", "Pat")


class CsvPricePrecisionTest(unittest.TestCase):
    def test_fraction_of_a_cent(self):
        invoice, _, again = round_trip(LineItem("API calls", Decimal("1"), Decimal("0.145")))
        self.assertEqual(invoice.total, Decimal("0.15"))
        self.assertEqual(again.total, Decimal("0.15"))

    def test_many_units_at_a_fractional_price(self):
        invoice, _, again = round_trip(LineItem("API calls", Decimal("1000"), Decimal("0.145")))
        self.assertEqual(again.total, invoice.total)
        self.assertEqual(again.total, Decimal("145.00"))

    def test_unit_price_written_exactly(self):
        _, text, again = round_trip(LineItem("Diesel", Decimal("40"), Decimal("1.859")))
        row = next(csv.DictReader(io.StringIO(text)))
        self.assertEqual(row["unit_price"], "1.859")
        self.assertEqual(again.items[0].unit_price, Decimal("1.859"))
        self.assertEqual(again.total, Decimal("74.36"))

    def test_items_are_restored(self):
        invoice, _, again = round_trip(
            LineItem("Hosting", Decimal("3"), Decimal("12.3456"), Decimal("0.2")),
            LineItem("Setup", Decimal("1"), Decimal("99.00"), discount=Decimal("0.1")),
        )
        self.assertEqual(again.items, invoice.items)


if __name__ == "__main__":
    unittest.main()
