"""A profile's fingerprint: the catalog and the scheduler agree on it to tell a stale replica."""

from __future__ import annotations

import hashlib

import msgspec

from llmgw.proto.catalog import Model, Profile

__all__ = ["fingerprint"]


def fingerprint(model: Model, profile: Profile) -> str:
    """What a running replica was started with: the weights, the context, how it runs, the generation.

    Counts, router weight, priority and the startup timeout are left out: changing them never
    restarts a running replica. So are the longest answer and an adapter's scale, which the router
    applies at once; the adapters loaded (by name and file) are in, where there are any.
    """
    kept = msgspec.to_builtins(
        msgspec.structs.replace(profile, replicas=None, weight=1, priority=0, startup_timeout_s=1)
    )
    for name, default in _ADDED.items():
        if kept.get(name) == default:
            del kept[name]
    what = [model.source, model.context, model.generation, kept]
    if model.adapters:
        what.append([[a.name, a.source] for a in model.adapters])
    return hashlib.sha256(msgspec.json.encode(what)).hexdigest()[:16]


_ADDED = {"nodes": 1, "keep_within": "", "min_card_mb": 0, "min_compute": "", "kv_events": False, "cpu_moe_layers": 0}
"""Profile fields added after replicas were first fingerprinted: left out at their defaults, so
an upgrade does not make every running replica stale."""
