import unittest

from calc.ops import clamp


class TestClamp(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_outside(self):
        self.assertEqual(clamp(-1, 0, 10), 0)
