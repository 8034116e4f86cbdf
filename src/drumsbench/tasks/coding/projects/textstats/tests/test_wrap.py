import unittest

from textstats.wrap import fill, truncate, wrap


class WrapTest(unittest.TestCase):
    def test_lines_fill_up_to_width(self):
        self.assertEqual(
            wrap("The quick brown fox jumps over the lazy dog", 10),
            ["The quick", "brown fox", "jumps over", "the lazy", "dog"],
        )

    def test_long_words_are_split(self):
        self.assertEqual(wrap("abcdefghijkl xy", 5), ["abcde", "fghij", "kl xy"])

    def test_blank_text(self):
        self.assertEqual(wrap("  \n "), [])

    def test_fill_joins_lines(self):
        self.assertEqual(fill("aa bb cc", 5), "aa bb\ncc")

    def test_short_text_is_not_truncated(self):
        self.assertEqual(truncate("  short   text ", 40), "short text")


if __name__ == "__main__":
    unittest.main()
