"""textstats: word and sentence statistics and plain-text wrapping.

Everything is pure Python and works on ``str``; nothing is read from or written to disk.
"""

from textstats.stats import (
    Summary,
    average_sentence_length,
    average_word_length,
    count_sentences,
    count_words,
    reading_ease,
    summary,
    syllables,
    top_words,
    word_frequencies,
)
from textstats.tokenize import normalize, sentences, words
from textstats.wrap import fill, truncate, wrap

__all__ = [
    "Summary",
    "average_sentence_length",
    "average_word_length",
    "count_sentences",
    "count_words",
    "fill",
    "normalize",
    "reading_ease",
    "sentences",
    "summary",
    "syllables",
    "top_words",
    "truncate",
    "word_frequencies",
    "words",
    "wrap",
]

__version__ = "1.3.0"
