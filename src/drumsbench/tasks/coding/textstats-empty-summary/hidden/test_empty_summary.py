import unittest

from textstats.stats import (
    Summary,
    average_sentence_length,
    average_word_length,
    reading_ease,
    summary,
)

ZERO = Summary(
    words=0, sentences=0, average_word_length=0.0, average_sentence_length=0.0, reading_ease=0.0
)


class EmptySummaryTest(unittest.TestCase):
    def test_empty_document(self):
        self.assertEqual(summary(""), ZERO)

    def test_whitespace_only_document(self):
        self.assertEqual(summary("  \n\t \n"), ZERO)

    def test_punctuation_only_document(self):
        result = summary("... !? --")
        self.assertEqual(result.words, 0)
        self.assertEqual(result.average_word_length, 0.0)
        self.assertEqual(result.average_sentence_length, 0.0)
        self.assertEqual(result.reading_ease, 0.0)

    def test_functions_accept_empty_text(self):
        self.assertEqual(average_word_length(""), 0.0)
        self.assertEqual(average_sentence_length(""), 0.0)
        self.assertEqual(reading_ease(" "), 0.0)


if __name__ == "__main__":
    unittest.main()
