"""The filter chain: each filter says why a node cannot take a replica, or None if it can."""

from __future__ import annotations

from collections.abc import Callable

from llmgw.modelplan import card_fits, usable_cards
from llmgw.proto import GpuInfo
from llmgw.scheduler.placement._room import Need, NodeState

__all__ = ["FILTERS", "Filter", "best_class", "cards_for", "fitting_cards"]

Filter = Callable[[Need, NodeState, float, float], str | None]
"""(need, node, now, stale_s) -> why not, or None."""


def fitting_cards(need: Need, n: NodeState) -> list[GpuInfo]:
    """The node's free cards a replica of the need may take (`llmgw.modelplan.usable_cards`:
    its class or card needs, with the memory each must have). The filter and the scorers ask in
    turn, so the answer is kept on the node for the need last asked about."""
    if n.fitting is not None and n.fitting[0] is need:
        return n.fitting[1]
    out = usable_cards(need.profile, n.free_cards, need.card_mb) if n.free_cards else []
    n.fitting = (need, out)
    return out


def best_class(cards: list[GpuInfo], count: int) -> list[GpuInfo] | None:
    """`count` cards of one class, those linked to most of the others first; None if no class has enough."""
    by_class: dict[str, list[GpuInfo]] = {}
    for g in cards:
        by_class.setdefault(g.cls, []).append(g)
    for group in by_class.values():
        if len(group) >= count:
            if count == 1 or not any(g.nvlink_peers for g in group):
                return group[:count]
            uuids = {c.uuid for c in group}
            return sorted(group, key=lambda g: -len(uuids.intersection(g.nvlink_peers)))[:count]
    return None


def cards_for(need: Need, n: NodeState) -> list[str]:
    """The UUIDs of the cards a replica of the need takes on this node (none on the CPU)."""
    return [g.uuid for g in best_class(fitting_cards(need, n), need.cards) or []] if need.cards else []


def _enough(cards: list[GpuInfo], count: int) -> bool:
    """Some class has `count` of these cards."""
    if len(cards) < count:
        return False
    seen: dict[str, int] = {}
    for g in cards:
        seen[g.cls] = seen.get(g.cls, 0) + 1
        if seen[g.cls] >= count:
            return True
    return False


def _ready(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    age = now - n.last_seen
    return f"no heartbeat for {age:.0f}s" if age > stale_s else None


def _labels(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if not need.profile.node_selector:
        return None
    wrong = [f"{k}={v}" for k, v in need.profile.node_selector.items() if n.info.labels.get(k) != v]
    return f"lacks the labels {', '.join(wrong)}" if wrong else None


def _engine(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if n.info.engines and need.profile.engine not in n.info.engines:
        return f"has no {need.profile.engine} (has {', '.join(sorted(n.info.engines))})"
    if need.profile.nodes > 1 and n.info.engines and f"{need.profile.engine}-rpc" not in n.info.engines:
        return f"has no {need.profile.engine} RPC worker, which a replica across nodes needs (-DGGML_RPC=ON)"
    return None


def _cards(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if not need.cards:
        return None
    fit = fitting_cards(need, n)
    if not _enough(fit, need.cards):
        wanted = need.profile.gpu_class or "any class"
        unfit = next((why for g in n.info.gpus if (why := card_fits(need.profile, g))), None)
        return (
            f"needs {need.cards} free {wanted} cards of {need.card_mb} MiB; has {len(fit)} "
            f"(of {len(n.info.gpus)})" + (f"; its cards: {unfit}" if unfit else "")
        )
    return None


def _memory(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if need.memory_mb > n.free_mb:
        return f"needs {need.memory_mb} MiB, {max(n.free_mb, 0)} MiB free"
    return None


def _cores(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    cores, free = need.profile.cpu_cores, n.info.cpus - n.cores_held
    if cores and cores > free:
        return f"needs {cores} cores, {max(free, 0)} of {n.info.cpus} free"
    return None


def _keep_within(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    label = need.profile.keep_within
    if label and label not in n.info.labels:
        return f"has no '{label}' label, and this profile keeps its nodes within one {label}"
    return None


FILTERS: list[tuple[str, Filter]] = [
    ("ready", _ready),
    ("labels", _labels),
    ("engine", _engine),
    ("cards", _cards),
    ("memory", _memory),
    ("cores", _cores),
    ("keep_within", _keep_within),
]
"""The filter chain, in order; the first that refuses a node gives its reason."""
