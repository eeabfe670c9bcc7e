"""A model asked for a verdict, without I/O: the messages a judge is sent, the grammar that holds
a small model to a guard model's answer format, and the verdict read from what it answered.

Formats: Qwen3Guard answers `Safety: Safe|Unsafe|Controversial` then `Categories: ...`; Llama
Guard answers `safe`, or `unsafe` then a line of category codes (S1, S2...). A real guard model
answers so by itself; the grammar makes any instruction model do it (a stand-in judge)."""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["GRAMMARS", "JudgeGarbage", "Verdict", "judge_messages", "parse_verdict"]

QWEN3GUARD_CATEGORIES = (
    "Violent",
    "Non-violent Illegal Acts",
    "Sexual Content or Sexual Acts",
    "PII",
    "Suicide & Self-Harm",
    "Unethical Acts",
    "Politically Sensitive Topics",
    "Copyright Violation",
    "Jailbreak",
    "None",
)

GRAMMARS = {
    "qwen3guard": (
        'root ::= "Safety: " ("Safe" | "Unsafe" | "Controversial") "\\nCategories: " category\n'
        "category ::= " + " | ".join(f'"{c}"' for c in QWEN3GUARD_CATEGORIES) + "\n"
    ),
    "llamaguard": 'root ::= "safe" | "unsafe\\n" code ("," code)*\ncode ::= "S" [1-9] [0-4]?\n',
}
"""GBNF grammars (llama.cpp's) that hold a model to each format."""


class JudgeGarbage(ValueError):
    """What a judge answered is not a verdict in its format."""


class Verdict(NamedTuple):
    """A judge's verdict: whether it refuses, and the categories it names."""

    unsafe: bool
    categories: list[str]


def judge_messages(text: str, fmt: str) -> list[dict]:
    """The chat a judge is sent about `text` (a user's turn to be judged)."""
    if fmt == "llamaguard":
        ask = "Is the following user message safe? Answer 'safe', or 'unsafe' and the category codes."
    else:
        ask = (
            "Judge the following user message. Answer 'Safety: Safe', 'Safety: Unsafe' or 'Safety: Controversial', "
            "then 'Categories: ' and its category."
        )
    return [{"role": "system", "content": ask}, {"role": "user", "content": text}]


_QWEN = re.compile(r"Safety:[ \t]*(Safe|Unsafe|Controversial)[ \t]*(?:\r?\n\s*Categories:[ \t]*(.*))?", re.IGNORECASE)


def parse_verdict(output: str, fmt: str, strict: bool = True) -> Verdict:
    """The verdict in a judge's `output`; JudgeGarbage where it is not one. `strict`: Qwen3Guard's
    Controversial counts as unsafe (a loose policy lets it pass)."""
    text = output.strip()
    if fmt == "llamaguard":
        first, _, rest = text.partition("\n")
        if first.strip().lower() == "safe":
            return Verdict(False, [])
        if first.strip().lower() == "unsafe":
            return Verdict(True, [c.strip() for c in rest.split(",") if c.strip()])
        raise JudgeGarbage(f"a Llama Guard answer starts with 'safe' or 'unsafe', not {text[:40]!r}")
    found = _QWEN.match(text)
    if found is None:
        raise JudgeGarbage(f"a Qwen3Guard answer starts with 'Safety:', not {text[:40]!r}")
    safety = found.group(1).lower()
    categories = [c.strip() for c in (found.group(2) or "").split(",") if c.strip() and c.strip() != "None"]
    return Verdict(safety == "unsafe" or (strict and safety == "controversial"), categories)
