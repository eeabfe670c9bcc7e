"""The terminal console's words in English and Turkish (words.json: one entry per phrase; a name,
a model's or a node's, is never translated); `Words.t` fills in the blanks."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["LANGUAGES", "SAID", "TYPED", "Words"]

LANGUAGES = ("en", "tr")

_WORDS: dict[str, dict[str, str]] = json.loads((Path(__file__).parent / "words.json").read_text(encoding="utf-8"))
"""Key -> language -> phrase."""
TYPED = {"question_mark": "?", "slash": "/"}
"""Keys as a person types them."""
SAID = {
    "quit": "key.quit",
    "keys": "key.help",
    "refresh": "key.refresh",
    "language": "key.lang",
    "search": "key.search",
    "fetch": "key.fetch",
    **{f"{tab} tab": f"tab.{tab}" for tab in ("fleet", "models", "hub", "keys")},
}
"""What each binding does, in the console's words."""


class Words:
    """The console's words in one language."""

    def __init__(self, lang: str = "") -> None:
        lang = lang or ("tr" if os.environ.get("LANG", "").lower().startswith("tr") else "en")
        if lang not in LANGUAGES:
            raise ValueError(f"the console speaks {' and '.join(LANGUAGES)}, not '{lang}'")
        self.lang = lang

    def t(self, key: str, **blanks: object) -> str:
        """The phrase `key` in this language, its blanks filled."""
        return _WORDS[key][self.lang].format(**blanks)
