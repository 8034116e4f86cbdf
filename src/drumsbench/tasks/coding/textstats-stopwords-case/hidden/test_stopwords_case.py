import unittest

from textstats.stats import top_words


class StopwordsCaseTest(unittest.TestCase):
    def test_capitalized_stopwords(self):
        text = "The cat and the hat. And then THE END, and the cat left."
        result = dict(top_words(text, stopwords=["The", "And", "Then"]))
        self.assertNotIn("the", result)
        self.assertNotIn("and", result)
        self.assertNotIn("then", result)
        self.assertEqual(result["cat"], 2)

    def test_stopwords_with_typographic_apostrophe(self):
        text = "Don't panic. The guide says don't panic."
        self.assertEqual(
            top_words(text, stopwords=["Don\u2019t", "THE"]),
            [("panic", 2), ("guide", 1), ("says", 1)],
        )

    def test_lowercase_stopwords_still_work(self):
        self.assertEqual(top_words("a b a c", stopwords={"a"}), [("b", 1), ("c", 1)])

    def test_stopwords_fold_like_words(self):
        text = "Die Stra\u00dfe und die STRASSE"
        self.assertEqual(top_words(text, stopwords=["Stra\u00dfe", "DIE"]), [("und", 1)])


if __name__ == "__main__":
    unittest.main()
