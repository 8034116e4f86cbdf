import csv
import io
import unittest
from decimal import Decimal

from invoice.export import FIELDS, from_csv, to_csv
from invoice.models import Invoice, LineItem

DESCRIPTIONS = ["Cable, 2 m", 'Monitor 27", matte', "Support\nsecond line", "Plain"]


def make_invoice():
    items = [LineItem(d, Decimal("1"), Decimal("5.00")) for d in DESCRIPTIONS]
    return Invoice("Q-1", "Quinn", items)


class CsvQuotingTest(unittest.TestCase):
    def test_every_row_has_all_columns(self):
        rows = list(csv.reader(io.StringIO(to_csv(make_invoice()))))
        self.assertEqual(rows[0], list(FIELDS))
        self.assertEqual(len(rows), 1 + len(DESCRIPTIONS))
        for row in rows:
            self.assertEqual(len(row), len(FIELDS))

    def test_descriptions_survive_export(self):
        rows = list(csv.DictReader(io.StringIO(to_csv(make_invoice()))))
        self.assertEqual([row["description"] for row in rows], DESCRIPTIONS)

    def test_round_trip(self):
        invoice = make_invoice()
        again = from_csv(to_csv(invoice), "Q-2", "Quinn")
        self.assertEqual(again.items, invoice.items)
        self.assertEqual(again.total, Decimal("20.00"))


if __name__ == "__main__":
    unittest.main()
