"""A document's text cut into chunks of about so many words, without I/O: paragraphs are kept
whole where they fit, a long one is cut at sentence ends (or, failing those, at words), and each
chunk starts with the last words of the one before, so an answer split across them is still
found."""

from __future__ import annotations

import re

__all__ = ["chunks", "halves"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _pieces(paragraph: str, most: int) -> list[str]:
    """A paragraph as pieces of at most `most` words: whole, or its sentences, or its words."""
    words = paragraph.split()
    if len(words) <= most:
        return [" ".join(words)]
    out: list[str] = []
    for sentence in _SENTENCE.split(paragraph):
        said = sentence.split()
        out.extend(" ".join(said[i : i + most]) for i in range(0, len(said), most))
    return out


def chunks(text: str, words: int, overlap: int) -> list[str]:
    """`text` as chunks of at most about `words` words, each starting with the last `overlap`
    words of the one before."""
    overlap = min(overlap, words // 2)
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    out: list[str] = []
    current: list[str] = []
    for paragraph in paragraphs:
        for piece in _pieces(paragraph, words):
            said = piece.split()
            if current and len(current) + len(said) > words:
                out.append(" ".join(current))
                current = current[-overlap:] if overlap else []
            current.extend(said)
    if current and (not out or len(current) > overlap):
        out.append(" ".join(current))
    return out


def halves(chunk: str) -> list[str]:
    """A chunk its embedding model could not take at once, as two (each half its words)."""
    words = chunk.split()
    if len(words) > 1:
        return [" ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2 :])]
    return [chunk[: len(chunk) // 2], chunk[len(chunk) // 2 :]]  # one long word: its characters
