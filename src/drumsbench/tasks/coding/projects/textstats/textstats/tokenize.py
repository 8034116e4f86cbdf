"""Splitting text into words and sentences.

Words are runs of letters and digits; an apostrophe or a hyphen between two such runs belongs
to the word ("don't", "well-known"). A sentence ends with ``.``, ``!`` or ``?`` (possibly
repeated and followed by closing quotes or brackets) before whitespace or the end of the text.
A period after a known abbreviation such as "Dr." or "e.g." does not end a sentence.
"""

from __future__ import annotations

import re

__all__ = ["ABBREVIATIONS", "normalize", "sentences", "words"]

_WORD = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s|$)")
_OPENING = "(\"'\u201c\u2018["

#: Abbreviations, normalized and without their final period, that do not end a sentence.
ABBREVIATIONS = frozenset(
    {"dr", "e.g", "i.e", "jr", "mr", "mrs", "ms", "prof", "sr", "st", "vs"}
)


def normalize(word: str) -> str:
    """Fold ``word`` for case-insensitive comparison.

    Uses :meth:`str.casefold` (so "Straße" and "STRASSE" compare equal) and turns the
    typographic apostrophe into a plain one (so "don’t" and "don't" compare equal).
    """
    return word.replace("\u2019", "'").casefold()


def words(text: str) -> list[str]:
    """Return the words of ``text`` in their original spelling and order."""
    return _WORD.findall(text)


def _ends_with_abbreviation(chunk: str) -> bool:
    """True if the final period of ``chunk`` belongs to a known abbreviation."""
    if not chunk.endswith("."):
        return False
    last = chunk.split()[-1].lstrip(_OPENING)[:-1]
    return normalize(last) in ABBREVIATIONS


def sentences(text: str) -> list[str]:
    """Split ``text`` into sentences, each stripped of surrounding whitespace.

    Text after the last sentence-ending punctuation mark counts as a final sentence, so
    unterminated text (a title, a chat message) is still one sentence.
    """
    found: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        chunk = text[start : match.end()].strip()
        if not chunk or _ends_with_abbreviation(chunk):
            continue
        found.append(chunk)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        found.append(tail)
    return found
