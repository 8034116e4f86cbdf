import unittest
from datetime import datetime, timedelta, timezone

from intervals.interval import Interval, gaps, merge, total_duration


def at(hour, minute=0):
    return datetime(2024, 5, 1, hour, minute, tzinfo=timezone.utc)


class IntervalTest(unittest.TestCase):
    def test_parse_forms(self):
        expected = Interval(at(9), at(10, 30))
        self.assertEqual(Interval.parse("2024-05-01T09:00:00Z/2024-05-01T10:30:00Z"), expected)
        self.assertEqual(Interval.parse("2024-05-01T09:00:00Z/PT1H30M"), expected)
        self.assertEqual(Interval.parse("PT1H30M/2024-05-01T10:30:00Z"), expected)

    def test_str(self):
        self.assertEqual(str(Interval(at(9), at(10))), "2024-05-01T09:00:00Z/2024-05-01T10:00:00Z")

    def test_naive_datetimes_are_utc(self):
        self.assertEqual(Interval(datetime(2024, 5, 1, 9), datetime(2024, 5, 1, 10)).start, at(9))

    def test_end_before_start_is_refused(self):
        with self.assertRaises(ValueError):
            Interval(at(10), at(9))

    def test_contains_is_half_open(self):
        interval = Interval(at(9), at(10))
        self.assertIn(at(9), interval)
        self.assertNotIn(at(10), interval)

    def test_overlap_and_intersection(self):
        a, b = Interval(at(9), at(11)), Interval(at(10), at(12))
        self.assertTrue(a.overlaps(b))
        self.assertEqual(a.intersection(b), Interval(at(10), at(11)))
        self.assertIsNone(a.intersection(Interval(at(13), at(14))))

    def test_merge_overlapping(self):
        merged = merge(
            [Interval(at(13), at(14)), Interval(at(9), at(11)), Interval(at(10), at(12))]
        )
        self.assertEqual(merged, [Interval(at(9), at(12)), Interval(at(13), at(14))])

    def test_gaps(self):
        busy = [Interval(at(9), at(10)), Interval(at(12), at(13))]
        self.assertEqual(
            gaps(busy, Interval(at(8), at(17))),
            [Interval(at(8), at(9)), Interval(at(10), at(12)), Interval(at(13), at(17))],
        )

    def test_total_duration_counts_overlap_once(self):
        busy = [Interval(at(9), at(11)), Interval(at(10), at(12))]
        self.assertEqual(total_duration(busy), timedelta(hours=3))


if __name__ == "__main__":
    unittest.main()
