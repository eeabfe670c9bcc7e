"""The filter chain: each filter says why a node cannot take a replica, or None if it can. The
reason is built only when it is read (`Why`): most nodes that refuse a replica are never named."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from llmgw.modelplan import card_fits, choose_cards, usable_cards
from llmgw.proto import GpuInfo
from llmgw.scheduler.placement._room import Need, NodeState, longest_context

__all__ = ["FILTERS", "Filter", "Why", "cards_for", "chain", "chosen_cards", "fits"]

Why = Callable[[], str]
"""Builds the text of why a node refused, when it is shown."""
Filter = Callable[[Need, NodeState, float, float], Why | None]
"""(need, node, now, stale_s) -> why not, or None."""


_UNKNOWN: list[GpuInfo] = []
"""Not yet chosen (no list the choice gives is this one)."""


def chosen_cards(need: Need, n: NodeState) -> list[GpuInfo] | None:
    """The free cards a replica of the need takes on this node, by the agent's rule
    (`llmgw.modelplan.choose_cards`: of its class and needs, all of one class, the most
    NVLinked first), or None where too few are free. The filter, the scorers and the placement
    ask in turn, so the answer is kept on the node for needs alike in `Need.card_choice`."""
    if n.chosen is None:
        n.chosen = {}
    elif (chosen := n.chosen.get(need.card_choice, _UNKNOWN)) is not _UNKNOWN:
        return chosen
    chosen = None
    if len(n.free_cards) >= need.cards:  # fewer free cards than it needs: no choice to make
        with contextlib.suppress(ValueError):  # too few of one class that fit: the filter says why
            chosen = choose_cards(need.profile, n.free_cards, card_mb=need.card_mb)
    n.chosen[need.card_choice] = chosen
    return chosen


def cards_for(need: Need, n: NodeState) -> list[str]:
    """The UUIDs of the cards a replica of the need takes on this node (none on the CPU)."""
    return [g.uuid for g in chosen_cards(need, n) or []] if need.cards else []


def _ready(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    age = now - n.last_seen
    return (lambda: f"no heartbeat for {age:.0f}s") if age > stale_s else None


def _labels(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    if not need.profile.node_selector:
        return None
    wrong = [f"{k}={v}" for k, v in need.profile.node_selector.items() if n.info.labels.get(k) != v]
    return (lambda: f"lacks the labels {', '.join(wrong)}") if wrong else None


def _engine(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    engines, engine = n.info.engines, need.profile.engine
    if engines and engine not in engines:
        return lambda: f"has no {engine} (has {', '.join(sorted(engines))})"
    if need.profile.nodes > 1 and engines and f"{engine}-rpc" not in engines:
        return lambda: f"has no {engine} RPC worker, which a replica across nodes needs (-DGGML_RPC=ON)"
    return None


def _cards(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    if not need.cards or chosen_cards(need, n) is not None:
        return None
    free = n.free_cards  # as it is now (placing a replica replaces the list, never changes it)
    return lambda: _no_cards(need, n.info.gpus, free)


def _no_cards(need: Need, gpus: list[GpuInfo], free: list[GpuInfo]) -> str:
    """Why too few of the free cards `free` (of `gpus`) fit the need."""
    fit = usable_cards(need.profile, free, need.card_mb) if free else []
    wanted = need.profile.gpu_class or "any class"
    unfit = next((why for g in gpus if (why := card_fits(need.profile, g))), None)
    why = f"needs {need.cards} free {wanted} cards of {need.card_mb} MiB; has {len(fit)} (of {len(gpus)})"
    if need.sizing:
        why += f" ({need.sizing})"
    largest = max((g.memory_total_mb - g.memory_foreign_mb for g in free), default=0)
    return why + (f"; its cards: {unfit}" if unfit else "") + _shorter(need, largest, "its largest free card")


def _shorter(need: Need, have_mb: int, where: str) -> str:
    """What context would fit `have_mb`, said where the need's context does not."""
    context = longest_context(need, have_mb) if have_mb > 0 else 0
    return f"; a context of {context} would fit {where}" if context else ""


def _memory(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    if need.memory_mb <= n.free_mb:
        return None
    free = n.free_mb

    def why() -> str:
        sizing = f" ({need.sizing})" if need.sizing else ""
        # beside cards, the host holds experts a shorter context does not shrink
        shorter = "" if need.cards else _shorter(need, free, "here")
        return f"needs {need.memory_mb} MiB{sizing}, {max(free, 0)} MiB free" + shorter

    return why


def _cores(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    cores, cpus, free = need.profile.cpu_cores, n.info.cpus, n.info.cpus - n.cores_held
    if cores and cores > free:
        return lambda: f"needs {cores} cores, {max(free, 0)} of {cpus} free"
    return None


def _keep_within(need: Need, n: NodeState, now: float, stale_s: float) -> Why | None:
    label = need.profile.keep_within
    if label and label not in n.info.labels:
        return lambda: f"has no '{label}' label, and this profile keeps its nodes within one {label}"
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

_ONLY_IF: dict[str, Callable[[Need], bool]] = {
    "labels": lambda need: bool(need.profile.node_selector),
    "cards": lambda need: need.cards > 0,
    "cores": lambda need: bool(need.profile.cpu_cores),
    "keep_within": lambda need: bool(need.profile.keep_within),
}
"""The filters that refuse no node for a need without these (no selector, no cards, ...)."""


def chain(need: Need) -> list[tuple[str, Filter]]:
    """The filters of the chain that may refuse a replica of `need`, in order: the others pass
    every node for it, so a scan asks only these."""
    return [(label, f) for label, f in FILTERS if label not in _ONLY_IF or _ONLY_IF[label](need)]


def fits(need: Need, n: NodeState, now: float, stale_s: float) -> bool:
    """Whether node `n` passes every filter for a replica of `need`."""
    return all(f(need, n, now, stale_s) is None for _, f in chain(need))
