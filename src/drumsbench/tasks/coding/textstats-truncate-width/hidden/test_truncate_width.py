import unittest

from textstats.wrap import truncate

TEXT = "Hello brave new world, how are you today?"


class TruncateWidthTest(unittest.TestCase):
    def test_default_placeholder(self):
        self.assertEqual(truncate("Hello brave new world", 10), "Hello bra\u2026")

    def test_longer_placeholder(self):
        self.assertEqual(truncate("Hello brave new world", 10, "..."), "Hello b...")
        self.assertEqual(truncate("Hello brave new world", 12, " [more]"), "Hello [more]")

    def test_never_longer_than_width(self):
        too_long = []
        for placeholder in ["\u2026", "...", " [more]"]:
            for width in range(len(placeholder), len(TEXT) + 3):
                result = truncate(TEXT, width, placeholder)
                if len(result) > width or (len(TEXT) > width and not result.endswith(placeholder)):
                    too_long.append((width, result))
        self.assertEqual(too_long, [])

    def test_text_that_fits_exactly_is_kept(self):
        self.assertEqual(truncate("exactly ten", 11), "exactly ten")


if __name__ == "__main__":
    unittest.main()
