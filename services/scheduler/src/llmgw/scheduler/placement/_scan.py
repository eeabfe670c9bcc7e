"""The scan for the nodes that fit a replica: the filter chain over the fleet from a given node,
wrapping, until enough fit; and why each refused node refused.

An `Index` of a pass's fleet keeps, for each kind of need, the nodes that cannot take it all
pass long (a filter that looks at what a node is, not at what it has free: its heartbeat, its
labels, its engines, or no cards at all for a need of cards), so a scan with it visits only the
others; those it skipped within the stretch it scanned are still among its reasons (counted at
once, their texts built when read), in the order a scan of every node would have seen them."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterator, Mapping

from llmgw.scheduler.placement._filters import _UNKNOWN, FILTERS, Filter, Why, chain, chosen_cards, no_cards
from llmgw.scheduler.placement._room import Need, NodeState

__all__ = ["STATIC", "Index", "Reasons", "scan"]

STATIC = ("ready", "labels", "engine")
"""The filters that look only at what a node is (and the pass's time): first in the chain."""
_CARDS, _MEMORY = dict(FILTERS)["cards"], dict(FILTERS)["memory"]
_INLINE = ("cards", "memory")
"""The filters the indexed scan judges itself (`_scan_indexed`)."""


class Reasons(Mapping[str, str]):
    """Why each refused node refused ("filter: reason"), in the order they were seen; a reason's
    text is built when it is first read (most are never shown)."""

    def __init__(self) -> None:
        self._said: dict[str, str | tuple[str, Why]] = {}
        self._skipped = 0
        self._merge: Callable[[dict[str, str | tuple[str, Why]]], dict[str, str | tuple[str, Why]]] | None = None

    def refused(self, name: str, label: str, why: Why) -> None:
        """Node `name` refused by filter `label`; `why` says why, when asked."""
        self._said[name] = (label, why)

    def skipped(self, count: int, merge: Callable[[dict], dict]) -> None:
        """`count` nodes a scan skipped (refused all pass long): `merge` puts them among the
        reasons, in order, when the reasons are read."""
        self._skipped, self._merge = count, merge

    def _read(self) -> dict[str, str | tuple[str, Why]]:
        if self._merge is not None:
            self._said, self._merge, self._skipped = self._merge(self._said), None, 0
        return self._said

    def __setitem__(self, name: str, text: str) -> None:
        self._read()[name] = text

    def __getitem__(self, name: str) -> str:
        said = self._read()[name]
        if isinstance(said, tuple):
            label, why = said
            said = self._said[name] = f"{label}: {why()}"
        return said

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._said) + self._skipped


class Index:
    """A pass's fleet in order, and for each kind of need the nodes refused all pass long."""

    def __init__(self, nodes: dict[str, NodeState], now: float, stale_s: float) -> None:
        self.nodes = nodes
        self.names = list(nodes)
        self.states = list(nodes.values())
        """The nodes' states by position (kept in place as replicas are placed and released)."""
        self.position = {name: i for i, name in enumerate(self.names)}
        self.now, self.stale_s = now, stale_s
        self._kinds: dict[tuple, tuple[list[int], list[int], list[tuple[str, Why | None]]]] = {}

    def serves(self, nodes: dict[str, NodeState], now: float, stale_s: float) -> bool:
        """Whether the index was made for this fleet (this very view of it) and time."""
        return nodes is self.nodes and (now, stale_s) == (self.now, self.stale_s) and len(nodes) == len(self.names)

    def kind(
        self, need: Need, nodes: dict[str, NodeState]
    ) -> tuple[list[int], list[int], list[tuple[str, Why | None]]]:
        """For needs like `need`: the positions of the nodes a scan visits, those it skips, and
        why each skipped one refused (None: no cards, said by the cards filter when read)."""
        p = need.profile
        key = (tuple(sorted((p.node_selector or {}).items())), p.engine, p.nodes > 1, need.cards > 0)
        kind = self._kinds.get(key)
        if kind is None:
            static = [(label, f) for label, f in chain(need) if label in STATIC]
            visit, skip, said = [], [], []
            for i, name in enumerate(self.names):
                n = nodes[name]
                for label, f in static:
                    if why := f(need, n, self.now, self.stale_s):
                        skip.append(i)
                        said.append((label, why))
                        break
                else:
                    if need.cards and not n.info.gpus:
                        skip.append(i)
                        said.append(("cards", None))
                    else:
                        visit.append(i)
            kind = self._kinds[key] = (visit, skip, said)
        return kind


def _visit(need: Need, n: NodeState, filters: list[tuple[str, Filter]], now: float, stale_s: float):
    for label, f in filters:
        if why := f(need, n, now, stale_s):
            return label, why
    return None


def _wrapping(items: list[int], k: int, chunk: int = 256) -> Iterator[int]:
    """`items` from the `k`-th, wrapping round to the one before it, a slice at a time (a scan
    stops early: no walk past the first `k` to begin)."""
    for lo, hi in ((k, len(items)), (0, k)):
        for at in range(lo, hi, chunk):
            yield from items[at : min(at + chunk, hi)]


def scan(  # noqa: PLR0913 - the need, the fleet, the time, where to start, how many, the index
    need: Need, nodes: dict[str, NodeState], now: float, stale_s: float, start: int, limit: int, index: Index | None
) -> tuple[list[str], list[NodeState], Reasons]:
    """The nodes that pass every filter (at most `limit`, 0: all, scanning from the `start`-th
    and wrapping), their states, and why each refused node refused (filter: reason)."""
    first = start % max(len(nodes), 1)
    if index is not None and index.serves(nodes, now, stale_s):
        return _scan_indexed(need, nodes, (now, stale_s), first, limit, index)
    reasons, fit, fit_states = Reasons(), [], []
    filters, names, count = chain(need), list(nodes), len(nodes)
    for i in range(count):
        name = names[(first + i) % count]
        if refusal := _visit(need, n := nodes[name], filters, now, stale_s):
            reasons.refused(name, *refusal)
        else:
            fit.append(name)
            fit_states.append(n)
            if limit and len(fit) >= limit:
                break
    return fit, fit_states, reasons


def _scan_indexed(
    need: Need, nodes: dict[str, NodeState], when: tuple[float, float], first: int, limit: int, index: Index
) -> tuple[list[str], list[NodeState], Reasons]:
    """`scan` visiting only the nodes the index does not skip for the need."""
    reasons, fit, fit_states = Reasons(), [], []
    visit = index.kind(need, nodes)[0]
    # the cards and memory filters are judged here, inline (most nodes a scan visits are judged
    # by these two alone: a Python call per filter per node is most of a big pass), the rest by
    # the chain. A node refused for its cards is noted with its free cards as they are now (most
    # refusals: a full node), its reason put among the others when they are read
    late: list[tuple[int, list]] = []
    rest = [(label, f) for label, f in chain(need) if label not in STATIC and label not in _INLINE]
    choice, memory_mb = need.card_choice if need.cards else None, need.memory_mb
    names, states, k, last = index.names, index.states, bisect.bisect_left(visit, first), None
    now, stale_s = when
    for i in _wrapping(visit, k):
        n = states[i]
        if choice is not None:
            chosen = _UNKNOWN if n.chosen is None else n.chosen.get(choice, _UNKNOWN)
            if (chosen if chosen is not _UNKNOWN else chosen_cards(need, n)) is None:
                late.append((i, n.free_cards))  # (placing replaces the list, never changes it)
                continue
        if memory_mb > n.free_mb:
            reasons.refused(names[i], "memory", _MEMORY(need, n, now, stale_s))
            continue
        for label, f in rest:
            if why := f(need, n, now, stale_s):
                reasons.refused(names[i], label, why)
                break
        else:
            fit.append(names[i])
            fit_states.append(n)
            if len(fit) == limit:
                last = i
                break
    _add_unvisited(reasons, need, index, when, (first, last), late)
    return fit, fit_states, reasons


def _add_unvisited(
    reasons: Reasons,
    need: Need,
    index: Index,
    when: tuple[float, float],
    scanned: tuple[int, int | None],
    late: list[tuple[int, list]],
) -> None:
    """Put among `reasons`, when they are read, the nodes the index skipped within the stretch
    scanned (`scanned`: from the first position to the last, wrapping; all of it where the last
    is None) and those refused for their cards (`late`: position, free cards then)."""
    first, last = scanned
    _, skip, said = index.kind(need, index.nodes)
    if last is None:
        stretches = [(0, len(skip))]
    elif first <= last:
        stretches = [(bisect.bisect_left(skip, first), bisect.bisect_right(skip, last))]
    else:
        stretches = [(bisect.bisect_left(skip, first), len(skip)), (0, bisect.bisect_right(skip, last))]
    skipped = sum(hi - lo for lo, hi in stretches)
    if not skipped and not late:
        return
    names, states, count = index.names, index.states, len(index.names)

    def merge(seen: dict) -> dict:
        out = [((index.position[name] - first) % count, name, v) for name, v in seen.items()]
        for lo, hi in stretches:
            for s in range(lo, hi):
                label, why = said[s]
                at = skip[s]
                out.append(((at - first) % count, names[at], (label, why or _CARDS(need, states[at], *when))))
        for at, free in late:
            why = functools.partial(no_cards, need, states[at].info.gpus, free)
            out.append(((at - first) % count, names[at], ("cards", why)))
        out.sort(key=lambda e: e[0])
        return {name: v for _, name, v in out}

    reasons.skipped(skipped + len(late), merge)
