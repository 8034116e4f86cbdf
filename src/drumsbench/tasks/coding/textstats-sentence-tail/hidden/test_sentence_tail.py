import unittest

from textstats.stats import average_sentence_length, count_sentences
from textstats.tokenize import sentences


class SentenceTailTest(unittest.TestCase):
    def test_unterminated_last_sentence_is_kept(self):
        self.assertEqual(
            sentences("Meeting moved. See you at 3"),
            ["Meeting moved.", "See you at 3"],
        )

    def test_text_without_punctuation_is_one_sentence(self):
        self.assertEqual(sentences("  Untitled draft\n"), ["Untitled draft"])
        self.assertEqual(count_sentences("Untitled draft"), 1)

    def test_trailing_whitespace_is_not_a_sentence(self):
        self.assertEqual(count_sentences("One. Two!\n\n"), 2)
        self.assertEqual(sentences("Done.   "), ["Done."])

    def test_average_uses_the_last_sentence(self):
        self.assertEqual(average_sentence_length("Hello there. How are you"), 2.5)


if __name__ == "__main__":
    unittest.main()
