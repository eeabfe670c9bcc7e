"""How many replicas of a model run (by time of day, too), and the shortest context a model may
have: what a model and a change to it both say (`llmgw.proto.catalog` names them)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct, field

from llmgw.proto._types import NonNegative

__all__ = ["LEAST_CONTEXT", "Scaling", "ScheduleWindow"]

LEAST_CONTEXT = 128
"""The shortest context a model in the catalog may have, in tokens."""


class ScheduleWindow(Struct, kw_only=True):
    """A scaling that holds during part of the day (UTC, "HH:MM")."""

    start: Annotated[str, Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    end: Annotated[str, Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    min: NonNegative
    max: NonNegative


class Scaling(Struct, kw_only=True):
    """How many replicas of a model run."""

    min: NonNegative = 1
    """Replicas kept running at all times."""
    max: NonNegative = 1
    """Most replicas run at once."""
    idle_timeout_s: NonNegative | None = None
    """On-demand: scale to zero after this long without requests."""
    schedule: list[ScheduleWindow] = field(default_factory=list)
    """Scalings by time of day; outside every window min/max hold."""
