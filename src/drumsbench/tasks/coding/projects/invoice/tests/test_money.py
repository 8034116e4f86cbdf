import unittest
from decimal import Decimal

from invoice.money import allocate, format_money, parse_money, to_money


class MoneyTest(unittest.TestCase):
    def test_to_money_rounds_to_cents(self):
        self.assertEqual(to_money("19.999"), Decimal("20.00"))
        self.assertEqual(to_money(7), Decimal("7.00"))

    def test_floats_are_refused(self):
        with self.assertRaises(TypeError):
            to_money(0.1)

    def test_parse_money(self):
        self.assertEqual(parse_money("$1,234.50"), Decimal("1234.50"))
        self.assertEqual(parse_money("-$3.20"), Decimal("-3.20"))
        self.assertEqual(parse_money("(12.00)"), Decimal("-12.00"))

    def test_parse_money_rejects_garbage(self):
        for text in ["", "abc", "1.2.3", "$"]:
            with self.subTest(text=text), self.assertRaises(ValueError):
                parse_money(text)

    def test_format_money(self):
        self.assertEqual(format_money(Decimal("1234567.5")), "$1,234,567.50")
        self.assertEqual(format_money(Decimal("-3.2"), symbol="EUR "), "-EUR 3.20")

    def test_allocate_even_split(self):
        self.assertEqual(allocate(Decimal("9.00"), 3), [Decimal("3.00")] * 3)

    def test_allocate_needs_a_part(self):
        with self.assertRaises(ValueError):
            allocate(Decimal("1.00"), 0)


if __name__ == "__main__":
    unittest.main()
