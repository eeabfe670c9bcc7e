"""The console's words in English and Turkish: every string a page shows comes from the message
files beside this module (`messages/<area>.json`: `{"key": {"en": "...", "tr": "..."}}`), with
`{name}` placeholders filled in by keyword. The language is the browser's (Accept-Language)
unless the operator chose one with the switch (a cookie)."""

from __future__ import annotations

import json
import string
from importlib import resources

__all__ = ["LANGUAGES", "Messages", "choose_language"]

LANGUAGES = ("en", "tr")
"""What the console speaks; the first is the default."""


class Messages:
    """Every message of every area, by key, in each language."""

    def __init__(self, table: dict[str, dict[str, str]]) -> None:
        self.table = table

    @classmethod
    def load(cls) -> Messages:
        """The message files shipped with the console; a key in two files, a language missing, or
        placeholders that differ between the languages is a ValueError naming it."""
        table: dict[str, dict[str, str]] = {}
        for item in sorted(resources.files(__package__).joinpath("messages").iterdir(), key=lambda p: p.name):
            if not item.name.endswith(".json"):
                continue
            for key, words in json.loads(item.read_text(encoding="utf-8")).items():
                if key in table:
                    raise ValueError(f"console message '{key}' is in two files (again in {item.name})")
                if set(words) != set(LANGUAGES):
                    raise ValueError(f"console message '{key}' ({item.name}): {sorted(words)}, not {list(LANGUAGES)}")
                fields = {lang: _fields(text) for lang, text in words.items()}
                if len({frozenset(f) for f in fields.values()}) != 1:
                    raise ValueError(f"console message '{key}' ({item.name}) fills in different names: {fields}")
                table[key] = words
        return cls(table)

    def text(self, lang: str, key: str, **values: object) -> str:
        """The message `key` in `lang` with `values` filled in (a key not in the files is a KeyError:
        a page never shows an untranslated string)."""
        words = self.table[key][lang]
        return words.format_map(values) if values else words


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def choose_language(chosen: str | None, accept_language: str | None) -> str:
    """The operator's choice if it is one we speak, else the browser's first that we speak (by its
    q-values), else English."""
    if chosen in LANGUAGES:
        return chosen
    best, best_q = LANGUAGES[0], 0.0
    for part in (accept_language or "").split(","):
        tag, _, params = part.strip().partition(";")
        lang = tag.strip().lower().split("-")[0]
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                continue
        if lang in LANGUAGES and q > best_q:
            best, best_q = lang, q
    return best
