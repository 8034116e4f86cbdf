import unittest
from decimal import Decimal

from invoice.export import from_csv, to_csv
from invoice.models import Invoice, LineItem


def sample_invoice():
    return Invoice(
        "7",
        "ACME",
        [
            LineItem("Hosting", Decimal("2"), Decimal("15.00"), Decimal("0.1")),
            LineItem("Setup", Decimal("1"), Decimal("99.00"), discount=Decimal("0.5")),
        ],
    )


class ExportTest(unittest.TestCase):
    def test_header_and_rows(self):
        self.assertEqual(
            to_csv(sample_invoice()).splitlines(),
            [
                "description,quantity,unit_price,tax_rate,discount,total",
                "Hosting,2,15.00,0.1,0,33.00",
                "Setup,1,99.00,0,0.5,49.50",
            ],
        )

    def test_round_trip(self):
        invoice = sample_invoice()
        again = from_csv(to_csv(invoice), "8", "ACME")
        self.assertEqual(again.items, invoice.items)
        self.assertEqual(again.total, Decimal("82.50"))

    def test_bad_row_names_its_line(self):
        text = "description,quantity,unit_price\nOk,1,2.00\nBad,x,2.00\n"
        with self.assertRaisesRegex(ValueError, "line 3"):
            from_csv(text, "9", "ACME")

    def test_missing_columns(self):
        with self.assertRaisesRegex(ValueError, "unit_price"):
            from_csv("description,quantity\nA,1\n", "9", "ACME")


if __name__ == "__main__":
    unittest.main()
