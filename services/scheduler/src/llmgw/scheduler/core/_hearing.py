"""How long the scheduler could not judge its nodes: the time it was away from NATS, or heard
from no node at all. A node is judged silent only for the rest of the time (a control-plane
outage is not a node outage). Pure: the shell says when it heard what, and whether it was
connected; no clock is read here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from llmgw.proto import NodeHealth

if TYPE_CHECKING:
    from llmgw.scheduler.core._plan import NodeView, Policy

__all__ = ["Hearing", "health", "heard", "listen", "silence"]


class Hearing(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's deaf time, counted up to `at`."""

    deaf_s: float = 0.0
    """Seconds, all told, it was away from NATS or heard from no node."""
    at: float = 0.0
    """Unix time counted up to; 0: not counting yet (the first call starts it)."""
    last_beat: float = 0.0
    """Unix time of the newest heartbeat from any node; 0: none yet."""


def listen(h: Hearing, now: float, connected: bool, window_s: float) -> Hearing:
    """Count the time from `h.at` to `now`: all of it deaf unless `connected` (to NATS, over
    that time), else the part more than `window_s` (the policy's `stale_s`) after the newest
    heartbeat of any node: every node silent at once is the scheduler not hearing, not every
    node lost."""
    if not h.at or now <= h.at:
        return msgspec.structs.replace(h, at=max(now, h.at))
    heard_until = h.last_beat + window_s if connected and h.last_beat else h.at
    deaf = now - max(h.at, min(heard_until, now))
    return msgspec.structs.replace(h, deaf_s=h.deaf_s + deaf, at=now)


def heard(h: Hearing, now: float, window_s: float) -> Hearing:
    """A heartbeat came at `now` (so the scheduler was connected until then)."""
    return msgspec.structs.replace(listen(h, now, True, window_s), last_beat=now)


def silence(since: float, deaf_then: float, now: float, deaf_now: float) -> float:
    """Seconds silent at `now` since `since` (a node's last heartbeat), less the time the
    scheduler was deaf meanwhile (`deaf_then`, `deaf_now`: its `Hearing.deaf_s` at both)."""
    return now - since - (deaf_now - deaf_then)


def health(view: NodeView, now: float, deaf_s: float, policy: Policy) -> NodeHealth:
    """How a node stands at `now` (the scheduler deaf `deaf_s` all told by then): suspect once
    its `silence` passes `policy.stale_s` (no new replicas), lost once it passes `lost_s`."""
    silent = silence(view.last_seen, view.deaf_s, now, deaf_s)
    state = "lost" if silent > policy.lost_s else "suspect" if silent > policy.stale_s else "ready"
    return NodeHealth(state=state, silent_s=max(0.0, silent))
