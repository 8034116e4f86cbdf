import unittest
from datetime import date

from intervals.business import business_days_between

SUNDAY = date(2024, 3, 3)
MONDAY = date(2024, 3, 4)
WEDNESDAY = date(2024, 3, 6)
FRIDAY = date(2024, 3, 8)
SATURDAY = date(2024, 3, 9)
NEXT_MONDAY = date(2024, 3, 11)


class BusinessDaysEndTest(unittest.TestCase):
    def test_end_is_excluded(self):
        self.assertEqual(business_days_between(MONDAY, FRIDAY), 4)
        self.assertEqual(business_days_between(MONDAY, NEXT_MONDAY), 5)
        self.assertEqual(business_days_between(FRIDAY, NEXT_MONDAY), 1)

    def test_start_is_included(self):
        self.assertEqual(business_days_between(MONDAY, SATURDAY), 5)
        self.assertEqual(business_days_between(SUNDAY, FRIDAY), 4)
        self.assertEqual(business_days_between(MONDAY, MONDAY), 0)

    def test_holidays(self):
        self.assertEqual(business_days_between(MONDAY, NEXT_MONDAY, holidays=[WEDNESDAY]), 4)

    def test_reversed_range_is_negative(self):
        self.assertEqual(business_days_between(NEXT_MONDAY, MONDAY), -5)
        self.assertEqual(business_days_between(FRIDAY, MONDAY), -4)


if __name__ == "__main__":
    unittest.main()
