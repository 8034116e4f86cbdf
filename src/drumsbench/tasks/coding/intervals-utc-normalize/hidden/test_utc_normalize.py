import unittest
from datetime import datetime, timedelta, timezone

from intervals.interval import Interval, as_utc

CEST = timezone(timedelta(hours=2))
EST = timezone(timedelta(hours=-5))


class UtcNormalizeTest(unittest.TestCase):
    def test_offsets_are_converted(self):
        interval = Interval.parse("2024-05-01T09:00:00+02:00/2024-05-01T10:00:00+02:00")
        self.assertEqual(str(interval), "2024-05-01T07:00:00Z/2024-05-01T08:00:00Z")

    def test_overlap_across_offsets(self):
        local = Interval.parse("2024-05-01T09:00:00+02:00/PT1H")
        utc = Interval.parse("2024-05-01T07:30:00Z/PT1H")
        self.assertTrue(local.overlaps(utc))
        self.assertEqual(local.intersection(utc), Interval.parse("2024-05-01T07:30:00Z/PT30M"))

    def test_as_utc(self):
        moment = as_utc(datetime(2024, 5, 1, 9, 0, tzinfo=EST))
        self.assertEqual(moment.utcoffset(), timedelta(0))
        self.assertEqual((moment.day, moment.hour), (1, 14))
        naive = datetime(2024, 5, 1, 9)
        self.assertEqual(as_utc(naive), datetime(2024, 5, 1, 9, tzinfo=timezone.utc))

    def test_interval_fields_are_utc(self):
        start = datetime(2024, 5, 1, 23, 30, tzinfo=EST)
        end = datetime(2024, 5, 2, 9, 0, tzinfo=CEST)
        interval = Interval(start, end)
        self.assertEqual(interval.start, datetime(2024, 5, 2, 4, 30, tzinfo=timezone.utc))
        self.assertEqual(interval.start.utcoffset(), timedelta(0))
        self.assertEqual(interval.end.utcoffset(), timedelta(0))
        self.assertEqual(interval.end.hour, 7)
        self.assertEqual(interval.duration, timedelta(hours=2, minutes=30))


if __name__ == "__main__":
    unittest.main()
