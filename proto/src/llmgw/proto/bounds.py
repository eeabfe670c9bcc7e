"""The bounds every face (the web console's forms, the terminal console's, ctl's words) checks a
number against before asking a service, which decides what fits: one value for each, so the faces
never disagree on what they take."""

from __future__ import annotations

__all__ = [
    "MOST_CARDS",
    "MOST_CONTEXT",
    "MOST_CORES",
    "MOST_CPU_MB",
    "MOST_IDLE_S",
    "MOST_OWNER",
    "MOST_REPLICAS",
    "MOST_SCALE",
]

MOST_CONTEXT = 1 << 21
"""The longest context (and answer) a form takes, in tokens: the serve form's and the model
card's alike, so a model served with a long context can be changed from its card."""
MOST_CORES = 1024
"""The most CPU cores a form takes (the catalog refuses more than any node has)."""
MOST_REPLICAS = 64
"""The most replicas a profile is given from a form."""
MOST_CARDS = 64
"""The most cards a replica is given from a form."""
MOST_CPU_MB = 4 << 20
"""The most host memory a CPU replica reserves, MiB (4 TiB)."""
MOST_IDLE_S = 30 * 86400
"""The longest idle time of an on-demand model (30 days)."""
MOST_OWNER = 200
"""The longest owner's name."""
MOST_SCALE = 4
"""The strongest an adapter applies (`Adapter.scale`'s bound)."""
