import unittest
from datetime import datetime, timezone

from intervals.interval import Interval, merge


def at(hour):
    return datetime(2024, 5, 1, hour, tzinfo=timezone.utc)


class MergeTouchingTest(unittest.TestCase):
    def test_back_to_back_intervals_are_joined(self):
        self.assertEqual(
            merge([Interval(at(9), at(10)), Interval(at(10), at(11))]),
            [Interval(at(9), at(11))],
        )

    def test_unsorted_chain(self):
        chain = [Interval(at(12), at(13)), Interval(at(9), at(10)), Interval(at(10), at(12))]
        self.assertEqual(merge(chain), [Interval(at(9), at(13))])

    def test_separate_intervals_stay_separate(self):
        self.assertEqual(
            merge([Interval(at(9), at(10)), Interval(at(11), at(12))]),
            [Interval(at(9), at(10)), Interval(at(11), at(12))],
        )

    def test_touching_intervals_do_not_overlap(self):
        first, second = Interval(at(9), at(10)), Interval(at(10), at(11))
        self.assertFalse(first.overlaps(second))
        self.assertFalse(second.overlaps(first))
        self.assertIsNone(first.intersection(second))


if __name__ == "__main__":
    unittest.main()
