import unittest
from decimal import Decimal

from invoice.models import LineItem
from invoice.money import format_money, to_money


class RoundingModeTest(unittest.TestCase):
    def test_halves_round_away_from_zero(self):
        for value, expected in [
            ("0.125", "0.13"),
            ("0.135", "0.14"),
            ("2.665", "2.67"),
            ("-0.125", "-0.13"),
        ]:
            with self.subTest(value=value):
                self.assertEqual(to_money(value), Decimal(expected))

    def test_other_values_round_to_nearest(self):
        for value, expected in [
            ("0.121", "0.12"),
            ("0.129", "0.13"),
            ("-0.121", "-0.12"),
            ("7", "7.00"),
        ]:
            with self.subTest(value=value):
                self.assertEqual(to_money(value), Decimal(expected))

    def test_line_item_tax(self):
        item = LineItem("Book", Decimal("1"), Decimal("10.50"), tax_rate=Decimal("0.05"))
        self.assertEqual(item.tax, Decimal("0.53"))
        self.assertEqual(item.total, Decimal("11.03"))

    def test_format_money_rounds_half_up(self):
        self.assertEqual(format_money(Decimal("1234.565")), "$1,234.57")
        self.assertEqual(format_money(Decimal("0.004")), "$0.00")


if __name__ == "__main__":
    unittest.main()
