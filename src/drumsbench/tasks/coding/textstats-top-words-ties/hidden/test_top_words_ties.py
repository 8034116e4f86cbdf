import unittest

from textstats.stats import top_words


class TopWordsTiesTest(unittest.TestCase):
    def test_ties_are_alphabetical(self):
        self.assertEqual(
            top_words("pear apple pear apple fig"),
            [("apple", 2), ("pear", 2), ("fig", 1)],
        )

    def test_tie_at_the_cut_keeps_alphabetical_first(self):
        self.assertEqual(top_words("zebra yak xenops", 2), [("xenops", 1), ("yak", 1)])

    def test_count_still_dominates(self):
        text = "b b b a a c c d"
        self.assertEqual(top_words(text, 3), [("b", 3), ("a", 2), ("c", 2)])

    def test_ties_after_case_folding(self):
        text = "Delta alpha DELTA Alpha charlie bravo"
        self.assertEqual(
            top_words(text),
            [("alpha", 2), ("delta", 2), ("bravo", 1), ("charlie", 1)],
        )


if __name__ == "__main__":
    unittest.main()
