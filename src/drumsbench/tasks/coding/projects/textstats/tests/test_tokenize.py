import unittest

from textstats.tokenize import normalize, sentences, words


class WordsTest(unittest.TestCase):
    def test_apostrophes_and_hyphens_stay_inside_words(self):
        self.assertEqual(
            words("Don't panic: it's well-known."), ["Don't", "panic", "it's", "well-known"]
        )

    def test_punctuation_and_underscores_separate_words(self):
        self.assertEqual(
            words("snake_case, (brackets) -- dashes"), ["snake", "case", "brackets", "dashes"]
        )

    def test_unicode_letters(self):
        self.assertEqual(words("Ça va? Übermäßig gut."), ["Ça", "va", "Übermäßig", "gut"])

    def test_normalize_folds_case(self):
        self.assertEqual(normalize("HeLLo"), "hello")


class SentencesTest(unittest.TestCase):
    def test_basic_split(self):
        self.assertEqual(
            sentences("It rained. Did it stop? Yes!"),
            ["It rained.", "Did it stop?", "Yes!"],
        )

    def test_abbreviations_do_not_end_sentences(self):
        self.assertEqual(
            sentences("Dr. Smith met Mr. Jones. They talked."),
            ["Dr. Smith met Mr. Jones.", "They talked."],
        )

    def test_closing_quotes_belong_to_the_sentence(self):
        self.assertEqual(
            sentences('He said "stop." Then he left.'), ['He said "stop."', "Then he left."]
        )

    def test_decimal_point_does_not_split(self):
        self.assertEqual(sentences("Pi is about 3.14 today."), ["Pi is about 3.14 today."])


if __name__ == "__main__":
    unittest.main()
