"""Placement as a declared chain of small plugins: filters say why a node cannot take a replica,
scorers rank those that can (each normalised to 0-100, then weighted). Pure: no I/O, no clock.

A replica's need is its profile's: host memory and cores on the CPU, or a number of free cards
of a class with enough memory each; the memory is `llmgw.modelplan`'s estimate for the model's
shape (weights, KV cache for its context and slots, buffers) where its GGUF header was read.
Capacity is what is free now: memory the node reports as available less what replicas still
starting here have claimed, and cards no replica holds and no foreign process fills (the card
rules, and which cards a replica takes, are `llmgw.modelplan`'s, the agent's too). A replica
being stopped holds its cards and cores until it stopped.

A profile across several nodes needs that many nodes that each fit its share (the weights split
between them), within one rack (row, site) where it says so: the nodes scored best together.
"""

from llmgw.scheduler.placement._filters import FILTERS, Filter, cards_for, fits
from llmgw.scheduler.placement._place import Index, Reasons, Search, place
from llmgw.scheduler.placement._room import (
    LIVE,
    STARTING,
    Need,
    NodeState,
    Placement,
    claim,
    domain_of,
    hold,
    kv_cache_type,
    longest_context,
    need_for,
    need_of,
    node_states,
    release,
    spans,
)
from llmgw.scheduler.placement._scorers import SCORERS, Scorer, Weights, speed_of

__all__ = [
    "FILTERS",
    "LIVE",
    "SCORERS",
    "STARTING",
    "Filter",
    "Index",
    "Need",
    "NodeState",
    "Placement",
    "Reasons",
    "Scorer",
    "Search",
    "Weights",
    "cards_for",
    "claim",
    "domain_of",
    "fits",
    "hold",
    "kv_cache_type",
    "longest_context",
    "need_for",
    "need_of",
    "node_states",
    "place",
    "release",
    "spans",
    "speed_of",
]
