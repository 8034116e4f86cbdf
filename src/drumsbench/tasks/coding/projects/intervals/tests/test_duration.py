import unittest
from datetime import timedelta

from intervals.duration import format_duration, parse_duration


class DurationTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_duration("PT1H30M"), timedelta(hours=1, minutes=30))
        self.assertEqual(parse_duration("P2W"), timedelta(weeks=2))
        self.assertEqual(parse_duration("P1DT12H"), timedelta(days=1, hours=12))
        self.assertEqual(parse_duration("-PT15M"), timedelta(minutes=-15))

    def test_parse_rejects_invalid(self):
        for text in ["", "P", "PT", "P1DT", "P1Y", "P1M", "1H"]:
            with self.subTest(text=text), self.assertRaises(ValueError):
                parse_duration(text)

    def test_format(self):
        self.assertEqual(format_duration(timedelta(days=1, hours=2, minutes=30)), "P1DT2H30M")
        self.assertEqual(format_duration(timedelta(seconds=45)), "PT45S")
        self.assertEqual(format_duration(timedelta(0)), "PT0S")

    def test_round_trip(self):
        for delta in [timedelta(hours=5), timedelta(days=3), timedelta(seconds=61)]:
            with self.subTest(delta=delta):
                self.assertEqual(parse_duration(format_duration(delta)), delta)


if __name__ == "__main__":
    unittest.main()
