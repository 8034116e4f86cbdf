"""Greedy line wrapping and truncation of plain text."""

from __future__ import annotations

__all__ = ["fill", "truncate", "wrap"]


def wrap(text: str, width: int = 70) -> list[str]:
    """Wrap ``text`` into lines of at most ``width`` characters.

    Whitespace, newlines included, is collapsed. Words are kept whole unless a single word is
    longer than ``width``; such a word is split into pieces of ``width`` characters. Returns
    ``[]`` for text without any non-whitespace character.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = f"{current} {word}"
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int = 70) -> str:
    """Like :func:`wrap`, but return the lines joined with newlines."""
    return "\n".join(wrap(text, width))


def truncate(text: str, width: int, placeholder: str = "\u2026") -> str:
    """Shorten ``text`` to at most ``width`` characters.

    Whitespace is collapsed first. Text that fits is returned as is; longer text is cut and
    ``placeholder`` appended, so that the result, placeholder included, is at most ``width``
    characters long.
    """
    collapsed = " ".join(text.split())
    if len(collapsed) <= width:
        return collapsed
    if width < len(placeholder):
        raise ValueError("width is smaller than the placeholder")
    return collapsed[: width - len(placeholder)].rstrip() + placeholder
