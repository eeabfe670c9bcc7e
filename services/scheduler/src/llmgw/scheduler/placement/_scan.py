"""The scan for the nodes that fit a replica: the filter chain over the fleet from a given node,
wrapping, until enough fit; and why each refused node refused.

An `Index` of a pass's fleet keeps, for each kind of need, the nodes that cannot take it all
pass long (a filter that looks at what a node is, not at what it has free: its heartbeat, its
labels, its engines, or no cards at all for a need of cards), so a scan with it visits only the
others; those it skipped within the stretch it scanned are still among its reasons (counted at
once, their texts built when read), in the order a scan of every node would have seen them."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping

from llmgw.scheduler.placement._filters import FILTERS, Filter, Why, chain
from llmgw.scheduler.placement._room import Need, NodeState

__all__ = ["STATIC", "Index", "Reasons", "scan"]

STATIC = ("ready", "labels", "engine")
"""The filters that look only at what a node is (and the pass's time): first in the chain."""
_CARDS = dict(FILTERS)["cards"]


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
        self.names = list(nodes)
        self.position = {name: i for i, name in enumerate(self.names)}
        self.now, self.stale_s = now, stale_s
        self._kinds: dict[tuple, tuple[list[int], list[int], list[tuple[str, Why | None]]]] = {}

    def serves(self, nodes: dict[str, NodeState], now: float, stale_s: float) -> bool:
        """Whether the index was made for this fleet and time."""
        return (now, stale_s) == (self.now, self.stale_s) and len(nodes) == len(self.names)

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
) -> tuple[list[str], Reasons]:
    """The nodes that pass every filter (at most `limit`, 0: all, scanning from the `start`-th
    and wrapping), and why each refused node refused (filter: reason)."""
    first = start % max(len(nodes), 1)
    if index is not None and index.serves(nodes, now, stale_s):
        return _scan_indexed(need, nodes, (now, stale_s), first, limit, index)
    reasons, fit = Reasons(), []
    filters, names, count = chain(need), list(nodes), len(nodes)
    for i in range(count):
        name = names[(first + i) % count]
        if refusal := _visit(need, nodes[name], filters, now, stale_s):
            reasons.refused(name, *refusal)
        else:
            fit.append(name)
            if limit and len(fit) >= limit:
                break
    return fit, reasons


def _scan_indexed(
    need: Need, nodes: dict[str, NodeState], when: tuple[float, float], first: int, limit: int, index: Index
) -> tuple[list[str], Reasons]:
    """`scan` visiting only the nodes the index does not skip for the need."""
    reasons, fit = Reasons(), []
    visit, skip, said = index.kind(need, nodes)
    filters = [(label, f) for label, f in chain(need) if label not in STATIC]
    names, k, last = index.names, bisect.bisect_left(visit, first), None
    now, stale_s = when
    for i in _wrapping(visit, k):
        n = nodes[names[i]]
        for label, f in filters:
            if why := f(need, n, now, stale_s):
                reasons.refused(names[i], label, why)
                break
        else:
            fit.append(names[i])
            if len(fit) == limit:
                last = i
                break
    # the stretch scanned: from `first` to `last`, wrapping (all of it where the scan ran out)
    if last is None:
        stretches = [(0, len(skip))]
    elif first <= last:
        stretches = [(bisect.bisect_left(skip, first), bisect.bisect_right(skip, last))]
    else:
        stretches = [(bisect.bisect_left(skip, first), len(skip)), (0, bisect.bisect_right(skip, last))]
    skipped = sum(hi - lo for lo, hi in stretches)
    if not skipped:
        return fit, reasons
    count = len(names)

    def merge(seen: dict) -> dict:
        out = [((index.position[name] - first) % count, name, v) for name, v in seen.items()]
        for lo, hi in stretches:
            for s in range(lo, hi):
                label, why = said[s]
                name = names[skip[s]]
                out.append(((skip[s] - first) % count, name, (label, why or _CARDS(need, nodes[name], *when))))
        out.sort(key=lambda e: e[0])
        return {name: v for _, name, v in out}

    reasons.skipped(skipped, merge)
    return fit, reasons
