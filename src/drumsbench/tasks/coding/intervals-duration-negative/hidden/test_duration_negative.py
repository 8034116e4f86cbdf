import unittest
from datetime import timedelta

from intervals.duration import format_duration, parse_duration


class DurationNegativeTest(unittest.TestCase):
    def test_negative_duration_gets_a_sign(self):
        self.assertEqual(format_duration(timedelta(minutes=-90)), "-PT1H30M")
        self.assertEqual(format_duration(timedelta(days=-2, hours=-3)), "-P2DT3H")

    def test_tiny_negative_duration(self):
        self.assertEqual(format_duration(timedelta(microseconds=-1)), "-PT0.000001S")

    def test_round_trip(self):
        for delta in [
            timedelta(minutes=-90),
            timedelta(seconds=-0.5),
            timedelta(days=-1),
            timedelta(days=-3, seconds=5),
            timedelta(hours=26, seconds=1),
        ]:
            with self.subTest(delta=delta):
                self.assertEqual(parse_duration(format_duration(delta)), delta)

    def test_positive_durations_unchanged(self):
        self.assertEqual(format_duration(timedelta(hours=1, minutes=30)), "PT1H30M")


if __name__ == "__main__":
    unittest.main()
