import unittest
from decimal import Decimal

from invoice.money import allocate


def money(*values):
    return [Decimal(v) for v in values]


class AllocateRemainderTest(unittest.TestCase):
    def test_three_way_split(self):
        self.assertEqual(allocate(Decimal("100.00"), 3), money("33.34", "33.33", "33.33"))

    def test_remainder_spread_one_cent_each(self):
        self.assertEqual(
            allocate(Decimal("10.00"), 6),
            money("1.67", "1.67", "1.67", "1.67", "1.66", "1.66"),
        )

    def test_fewer_cents_than_parts(self):
        self.assertEqual(allocate(Decimal("0.02"), 3), money("0.01", "0.01", "0.00"))

    def test_shares_add_up_and_differ_by_at_most_a_cent(self):
        bad = []
        for amount in ["0.01", "0.05", "10.00", "99.99", "1234.57"]:
            for parts in range(1, 8):
                shares = allocate(Decimal(amount), parts)
                if (
                    len(shares) != parts
                    or sum(shares) != Decimal(amount)
                    or max(shares) - min(shares) > Decimal("0.01")
                    or shares != sorted(shares, reverse=True)
                ):
                    bad.append((amount, parts, shares))
        self.assertEqual(bad, [])


if __name__ == "__main__":
    unittest.main()
