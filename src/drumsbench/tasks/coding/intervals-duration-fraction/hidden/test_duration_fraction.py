import unittest
from datetime import timedelta

from intervals.duration import parse_duration


class DurationFractionTest(unittest.TestCase):
    def test_fractional_seconds(self):
        self.assertEqual(parse_duration("PT0.5S"), timedelta(milliseconds=500))
        self.assertEqual(parse_duration("PT2.75S"), timedelta(seconds=2, milliseconds=750))

    def test_fraction_on_larger_units(self):
        self.assertEqual(parse_duration("P0.5D"), timedelta(hours=12))
        self.assertEqual(parse_duration("PT1.25H"), timedelta(minutes=75))

    def test_decimal_comma(self):
        self.assertEqual(parse_duration("PT1,5H"), timedelta(minutes=90))
        self.assertEqual(parse_duration("-PT0,25S"), timedelta(milliseconds=-250))

    def test_malformed_fractions_are_rejected(self):
        for text in ["PT1..5S", "PT1.5.5S", "PT0.5", "P0.5"]:
            with self.subTest(text=text), self.assertRaises(ValueError):
                parse_duration(text)


if __name__ == "__main__":
    unittest.main()
