"""One model's replicas against what it wants: which to stop (surplus, stale replaced one at a
time) and, for each replica to start, the profiles to try."""

from __future__ import annotations

import weakref
from collections.abc import Mapping

from llmgw.proto import Model, Profile, ReplicaState, fingerprint
from llmgw.scheduler.core._plan import Stop

__all__ = ["fingerprints", "surplus", "wanted_counts", "wanted_profiles"]

_OF_MODEL: dict[int, tuple[weakref.ref[Model], Mapping[str, str]]] = {}


def fingerprints(model: Model) -> Mapping[str, str]:
    """Profile name -> `llmgw.proto.fingerprint`, remembered for the model object while it lives
    (a `Model` is frozen: a change is a new object); a steady pass asks every model's. Shared by
    every caller: read only."""
    key = id(model)
    known = _OF_MODEL.get(key)
    if known is None or known[0]() is not model:
        ref = weakref.ref(model, lambda _, key=key: _OF_MODEL.pop(key, None))
        known = _OF_MODEL[key] = (ref, {p.name: fingerprint(model, p) for p in model.profiles})
    return known[1]


def wanted_counts(model: Model) -> dict[str, int] | None:
    """Profile name -> how many replicas it wants, where a running model's profiles are
    counted; else None (the scaling decides how many, each on the best profile that fits)."""
    if model.stopped is None:
        for p in model.profiles:  # a loop, not all(): every model is asked, every pass
            if p.replicas is not None:
                return {p.name: p.replicas or 0 for p in model.profiles}
    return None


def surplus(
    model: Model, want: int, stale: list[ReplicaState], fresh: list[ReplicaState], counts: dict[str, int] | None
) -> list[Stop]:
    """Replicas to stop: stale ones whose replacements are ready, then any beyond what is wanted.

    Stale replicas are replaced one at a time. With a surge rollout a stale replica stops only
    once a fresh one stands ready for it; in place, one stale replica stops while no fresh one
    is starting, and only at full strength. Counted profiles over their count give up replicas
    only while the ready ones left still make the total.
    """
    stops = []
    ready = sum(r.state == "ready" for r in fresh)
    starting = len(fresh) - ready
    extra = max(0, ready + len(stale) - want)
    if model.rollout == "in-place" and stale and not starting and len(fresh) + len(stale) >= want:
        extra = max(extra, 1)  # only at full strength: a failed replacement never takes a second one down
    for r in stale[:extra]:
        stops.append(
            Stop(
                replica=r,
                reason="stale (context, cards, engine or a restart): replaced one at a time",
                drain=model.rollout != "in-place",
            )
        )
    if counts is None and len(fresh) <= want:
        return stops
    newest_first = sorted(fresh, key=lambda r: (r.state == "ready", -r.updated))  # those still starting go first
    if counts is None:
        over = max(0, len(fresh) - want)
        stops += [
            Stop(replica=r, reason=f"model '{model.name}' runs {len(fresh)}, wants {want}") for r in newest_first[:over]
        ]
        return stops
    ready_left = ready + len(stale) - len(stops)
    for profile, count in counts.items():
        mine = [r for r in newest_first if r.profile == profile]
        for r in mine[: max(0, len(mine) - count)]:
            if r.state == "ready" and ready_left - 1 < want:
                continue  # the short profiles' replicas are not ready yet: keep this one until they are
            ready_left -= r.state == "ready"
            stops.append(Stop(replica=r, reason=f"profile '{profile}' runs {len(mine)}, its count is {count}"))
    return stops


def wanted_profiles(
    model: Model, live: list[ReplicaState], stale: list[ReplicaState], missing: int, counts: dict[str, int] | None
) -> list[list[Profile]]:
    """For each replica to start, the profiles to try, best first."""
    if counts is None and missing <= 0:
        return []
    by_priority = sorted(model.profiles, key=lambda p: -p.priority)
    if counts is None:
        return [by_priority] * max(missing, 0)
    out = []
    for p in by_priority:
        short = counts.get(p.name, 0) - sum(1 for r in live if r.profile == p.name and r not in stale)
        out += [[p]] * max(0, short)
    if len(out) < missing and stale:  # a surge replacement goes where the stale replica ran
        first = next(p for p in model.profiles if p.name == stale[0].profile)
        out.append([first])
    return out
