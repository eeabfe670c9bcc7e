"""Field types every message module shares: names safe in subjects, sources, counts; and Empty."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

__all__ = ["Empty", "Name", "NameOrEmpty", "NonNegative", "Positive", "ReplicaStatus", "RepoId", "Source"]

Name = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$",
        description="letters, digits, '-' and '_', at most 63, starting with a letter or digit",
    ),
]
"""A name safe in NATS subjects and KV keys (no dots: they split subjects)."""

NameOrEmpty = Annotated[
    str,
    Meta(
        pattern=r"^([A-Za-z0-9][A-Za-z0-9_-]{0,62})?$",
        description="letters, digits, '-' and '_', at most 63, starting with a letter or digit (or empty)",
    ),
]
"""A `Name`, or empty where one is made when none is given."""


Source = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[0-9a-f]{40})?(/[A-Za-z0-9][A-Za-z0-9._-]*)+$",
        description="'<owner>/<repo>@<commit>/<file>' (the commit: 40 hex digits) as fetched from Hugging Face, "
        "or '<owner>/<repo>/<file>' as placed on the mirror by hand",
    ),
]
"""A weights file the mirror holds: pinned to the 40-hex commit it was fetched at, or placed by hand."""


RepoId = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$",
        description="a Hugging Face repo, '<owner>/<name>'",
    ),
]


NonNegative = Annotated[int, Meta(ge=0)]


Positive = Annotated[int, Meta(ge=1)]


ReplicaStatus = Literal["pending", "fetching", "starting", "ready", "draining", "failed", "stopped"]
"""A replica's life: placed (pending), weights fetched, engine starting, ready; draining while
it is being stopped (the router sends it nothing new), failed, stopped."""


class Empty(Struct, forbid_unknown_fields=False):
    """A request or reply with nothing in it."""
