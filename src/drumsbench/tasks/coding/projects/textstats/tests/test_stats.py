import unittest

from textstats.stats import count_words, summary, syllables, top_words, word_frequencies


class StatsTest(unittest.TestCase):
    def test_count_words(self):
        self.assertEqual(count_words("One two  three\nfour."), 4)

    def test_frequencies_ignore_case_by_default(self):
        freq = word_frequencies("The cat and the hat. THE END")
        self.assertEqual(freq["the"], 3)
        self.assertEqual(freq["cat"], 1)

    def test_frequencies_case_sensitive(self):
        freq = word_frequencies("Go go GO", ignore_case=False)
        self.assertEqual(freq, {"Go": 1, "go": 1, "GO": 1})

    def test_top_words_most_frequent_first(self):
        text = "red red red blue blue green"
        self.assertEqual(top_words(text, 2), [("red", 3), ("blue", 2)])

    def test_syllables(self):
        self.assertEqual([syllables(w) for w in ["cat", "make", "table", "banana"]], [1, 1, 2, 3])

    def test_summary(self):
        result = summary("The cat sat on the mat. It was happy.")
        self.assertEqual(result.words, 9)
        self.assertEqual(result.sentences, 2)
        self.assertEqual(result.average_sentence_length, 4.5)
        self.assertGreater(result.reading_ease, 90)


if __name__ == "__main__":
    unittest.main()
