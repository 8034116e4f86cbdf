"""Word, sentence and readability statistics."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from textstats.tokenize import normalize, sentences, words

__all__ = [
    "Summary",
    "average_sentence_length",
    "average_word_length",
    "count_sentences",
    "count_words",
    "reading_ease",
    "summary",
    "syllables",
    "top_words",
    "word_frequencies",
]

_VOWEL_GROUP = re.compile(r"[aeiouy]+")
_NOT_LETTER = re.compile(r"[^a-z]")


def count_words(text: str) -> int:
    """Number of words in ``text``."""
    return len(words(text))


def count_sentences(text: str) -> int:
    """Number of sentences in ``text``."""
    return len(sentences(text))


def word_frequencies(text: str, *, ignore_case: bool = True) -> Counter[str]:
    """How often each word occurs in ``text``.

    With ``ignore_case`` (the default) the keys are normalized words (see
    :func:`textstats.tokenize.normalize`); otherwise words are counted as spelled.
    """
    tokens = words(text)
    if ignore_case:
        tokens = [normalize(token) for token in tokens]
    return Counter(tokens)


def top_words(text: str, n: int = 10, *, stopwords: Iterable[str] = ()) -> list[tuple[str, int]]:
    """The ``n`` most frequent words of ``text`` as ``(word, count)``, most frequent first.

    Words are compared case-insensitively and returned normalized; words with the same count
    are ordered alphabetically. Words in ``stopwords`` are left out; they are matched
    case-insensitively as well.
    """
    stop = {normalize(word) for word in stopwords}
    freq = word_frequencies(text)
    ranked = sorted(
        ((word, count) for word, count in freq.items() if word not in stop),
        key=lambda item: (-item[1], item[0]),
    )
    return ranked[:n]


def syllables(word: str) -> int:
    """Estimate the number of syllables of an English ``word`` (at least 1).

    Counts groups of vowels, treating a final silent "e" as no syllable ("make" has one,
    "table" has two).
    """
    letters = _NOT_LETTER.sub("", normalize(word))
    groups = len(_VOWEL_GROUP.findall(letters))
    if letters.endswith("e") and not letters.endswith(("le", "ee")) and groups > 1:
        groups -= 1
    return max(groups, 1)


def average_word_length(text: str) -> float:
    """Mean number of characters per word; 0.0 if ``text`` has no words."""
    tokens = words(text)
    if not tokens:
        return 0.0
    return sum(len(token) for token in tokens) / len(tokens)


def average_sentence_length(text: str) -> float:
    """Mean number of words per sentence; 0.0 if ``text`` has no sentences."""
    found = sentences(text)
    if not found:
        return 0.0
    return sum(count_words(sentence) for sentence in found) / len(found)


def reading_ease(text: str) -> float:
    """Flesch reading-ease score of ``text``, rounded to 2 decimals; 0.0 if it has no words.

    Higher is easier: plain English scores 60-70, academic prose often below 30.
    """
    tokens = words(text)
    if not tokens:
        return 0.0
    words_per_sentence = len(tokens) / max(count_sentences(text), 1)
    syllables_per_word = sum(syllables(token) for token in tokens) / len(tokens)
    return round(206.835 - 1.015 * words_per_sentence - 84.6 * syllables_per_word, 2)


@dataclass(frozen=True)
class Summary:
    """The statistics :func:`summary` computes for one text."""

    words: int
    sentences: int
    average_word_length: float
    average_sentence_length: float
    reading_ease: float


def summary(text: str) -> Summary:
    """All statistics of ``text`` at once; averages are rounded to 2 decimals.

    Any text is accepted: an empty document gives zero counts and 0.0 averages.
    """
    return Summary(
        words=count_words(text),
        sentences=count_sentences(text),
        average_word_length=round(average_word_length(text), 2),
        average_sentence_length=round(average_sentence_length(text), 2),
        reading_ease=reading_ease(text),
    )
