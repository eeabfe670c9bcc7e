"""The bounds the console's forms check a number against before asking a service (which decides
what fits): one value for each, shared by every form that takes it (and the terminal console's:
`llmgw.proto.bounds`)."""

from __future__ import annotations

from llmgw.proto.bounds import MOST_CONTEXT, MOST_CORES

__all__ = ["MOST_CONTEXT", "MOST_CORES"]
