"""Field types every message module shares: names safe in subjects, sources, counts; and Empty."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

__all__ = ["Empty", "Name", "NonNegative", "Positive", "ReplicaStatus", "Source"]

Name = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$",
        description="letters, digits, '-' and '_', at most 63, starting with a letter or digit",
    ),
]
"""A name safe in NATS subjects and KV keys (no dots: they split subjects)."""


Source = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)+$",
        description="'<owner>/<repo>/<file>' as the mirror holds it",
    ),
]


NonNegative = Annotated[int, Meta(ge=0)]


Positive = Annotated[int, Meta(ge=1)]


ReplicaStatus = Literal["pending", "fetching", "starting", "ready", "draining", "failed", "stopped"]
"""A replica's life: placed (pending), weights fetched, engine starting, ready; draining while
it is being stopped (the router sends it nothing new), failed, stopped."""


class Empty(Struct, forbid_unknown_fields=False):
    """A request or reply with nothing in it."""
