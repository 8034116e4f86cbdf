import unittest
from datetime import date

from intervals.business import add_business_days, is_business_day, next_business_day

FRIDAY = date(2024, 3, 8)
SATURDAY = date(2024, 3, 9)
MONDAY = date(2024, 3, 11)


class BusinessTest(unittest.TestCase):
    def test_weekends_and_holidays(self):
        self.assertTrue(is_business_day(FRIDAY))
        self.assertFalse(is_business_day(SATURDAY))
        self.assertFalse(is_business_day(MONDAY, holidays={MONDAY}))

    def test_add_business_days_skips_weekend(self):
        self.assertEqual(add_business_days(FRIDAY, 1), MONDAY)
        self.assertEqual(add_business_days(MONDAY, -1), FRIDAY)
        self.assertEqual(add_business_days(FRIDAY, 1, holidays=[MONDAY]), date(2024, 3, 12))

    def test_add_zero_days(self):
        self.assertEqual(add_business_days(SATURDAY, 0), SATURDAY)

    def test_next_business_day(self):
        self.assertEqual(next_business_day(SATURDAY), MONDAY)
        self.assertEqual(next_business_day(FRIDAY), FRIDAY)


if __name__ == "__main__":
    unittest.main()
