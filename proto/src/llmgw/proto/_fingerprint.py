"""A profile's fingerprint: the catalog and the scheduler agree on it to tell a stale replica."""

from __future__ import annotations

import hashlib

import msgspec

from llmgw.proto._messages import Model, Profile

__all__ = ["fingerprint"]


def fingerprint(model: Model, profile: Profile) -> str:
    """What a running replica was started with: the weights, the context, how it runs, the generation.

    Counts, router weight, priority and the startup timeout are left out: changing them never
    restarts a running replica. So is the longest answer, which the router applies at once.
    """
    kept = msgspec.structs.replace(profile, replicas=None, weight=1, priority=0, startup_timeout_s=1)
    return hashlib.sha256(msgspec.json.encode([model.source, model.context, model.generation, kept])).hexdigest()[:16]
