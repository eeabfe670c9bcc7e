"""The bounds the console's forms check a number against before asking a service (which decides
what fits): one value for each, shared by every form that takes it."""

from __future__ import annotations

__all__ = ["MOST_CONTEXT", "MOST_CORES"]

MOST_CONTEXT = 1 << 21
"""The longest context (and answer) a form takes, in tokens: the serve form's and the model
card's alike, so a model served with a long context can be changed from its card."""
MOST_CORES = 1024
"""The most CPU cores a form takes (the catalog refuses more than any node has)."""
