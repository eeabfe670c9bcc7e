"""The scan for the nodes that fit a replica: the filter chain over the fleet from a given node,
wrapping, until enough fit; and why each refused node refused.

An `Index` of a pass's fleet keeps, for each kind of need, the nodes that cannot take it all
pass long (a filter that looks at what a node is, not at what it has free: its heartbeat, its
labels, its engines, or no cards at all for a need of cards), so a scan with it visits only the
others; and every node's free room in arrays (`Table`, told of each claim, hold and release:
`Rooms`), so it judges a stretch of them at once, in numpy: memory, cores and keep_within
exactly, and the cards exactly for a profile that asks only for a count (`any_cards`); for
any other, the nodes with as many free cards, the roomiest roomy enough, are checked one by
one. The nodes it refused, or skipped within the
stretch it scanned, are still among its reasons (counted at once, their texts built when read
from what they had free then), in the order a scan of every node would have seen them."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import numpy as np

from llmgw.scheduler.placement._filters import _UNKNOWN, FILTERS, Filter, Why, chain, chosen_cards
from llmgw.scheduler.placement._room import Need, NodeState, Rooms
from llmgw.scheduler.placement._table import Table, any_cards

__all__ = ["JUDGED", "STATIC", "Found", "Index", "Reasons", "scan"]

STATIC = ("ready", "labels", "engine")
"""The filters that look only at what a node is (and the pass's time): first in the chain."""
JUDGED = ("cards", "memory", "cores", "keep_within")
"""The filters on what a node has free (and its keep_within label): the indexed scan judges
them from its arrays (`_passing`). Every filter of the chain is one or the other."""
_CARDS = dict(FILTERS)["cards"]
_NO_CARDS = ("cards", None)
"""Why a node with no cards at all refuses a need of cards (said by the cards filter when read)."""


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


_Kind = tuple[np.ndarray, list[int], list[tuple[str, Why | None]]]
"""For a kind of need: the positions of the nodes a scan visits, those it skips, and why each
skipped one refused (None: no cards, said by the cards filter when read)."""


class Index:
    """A pass's fleet in order: each node's columns (`Table`), its free room kept as replicas are
    placed and released (the fleet's watcher), and for each kind of need the nodes refused all
    pass long."""

    def __init__(self, nodes: Rooms, now: float, stale_s: float) -> None:
        if not isinstance(nodes, Rooms):
            raise TypeError("an Index keeps the free room of a fleet node_states made (Rooms), told of each change")
        self.nodes = nodes
        self.names = list(nodes)
        self.table = Table(list(nodes.values()))
        self.states = self.table.states
        """The nodes' states by position (kept in place as replicas are placed and released)."""
        self.position = {name: i for i, name in enumerate(self.names)}
        self.now, self.stale_s = now, stale_s
        self._kinds: dict[tuple, _Kind] = {}
        self._watch = nodes.watched_by(self.changed)

    def changed(self, name: str) -> None:
        """Read node `name`'s free room again (a replica was placed or released there)."""
        i = self.position.get(name)
        if i is not None:
            self.table.row(i, self.nodes[name])

    def serves(self, nodes: dict[str, NodeState], now: float, stale_s: float) -> bool:
        """Whether the index was made for this fleet (this very view of it) and time, and is
        still the one it tells of its changes."""
        return (
            nodes is self.nodes
            and (now, stale_s) == (self.now, self.stale_s)
            and len(nodes) == len(self.names)
            and self.nodes.watch is self._watch
        )

    def kind(self, need: Need, nodes: dict[str, NodeState]) -> _Kind:
        """For needs like `need`: the nodes a scan visits, those it skips and why (`_Kind`)."""
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
                        said.append(_NO_CARDS)
                    else:
                        visit.append(i)
            kind = self._kinds[key] = (np.array(visit, np.intp), skip, said)
        return kind


def _visit(need: Need, n: NodeState, filters: list[tuple[str, Filter]], now: float, stale_s: float):
    for label, f in filters:
        if why := f(need, n, now, stale_s):
            return label, why
    return None


def _stretches(count: int, k: int, limit: int) -> Iterator[tuple[int, int]]:
    """Stretches of `count` visited positions from the `k`-th, wrapping round to the one before
    it: twice the limit first (most scans stop there), then twice as many each time."""
    size = 2 * limit if limit else count
    for lo, hi in ((k, count), (0, k)):
        at = lo
        while at < hi:
            yield at, min(at + size, hi)
            at, size = min(at + size, hi), 2 * size


class Found(NamedTuple):
    """What a scan found: the nodes that fit, as positions in a table of node states (and the
    names by position), and why each refused node refused (filter: reason)."""

    table: Table
    names: list[str]
    at: np.ndarray
    reasons: Reasons

    @property
    def fit(self) -> list[str]:
        """The names of the nodes that fit, in the order found."""
        return [self.names[i] for i in self.at.tolist()]


def scan(  # noqa: PLR0913 - the need, the fleet, the time, where to start, how many, the index
    need: Need, nodes: dict[str, NodeState], now: float, stale_s: float, start: int, limit: int, index: Index | None
) -> Found:
    """The nodes that pass every filter (at most `limit`, 0 or less: all, scanning from the
    `start`-th and wrapping), and why each refused node refused."""
    first, limit = start % max(len(nodes), 1), max(limit, 0)
    if index is not None and index.serves(nodes, now, stale_s):
        return _scan_indexed(need, (now, stale_s), first, limit, index)
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
    return Found(Table(fit_states), fit, np.arange(len(fit)), reasons)


def _passing(need: Need, table: Table, at: np.ndarray) -> tuple[np.ndarray, bool]:
    """Which of the nodes at positions `at` pass the memory, cores, keep_within and cards
    filters; and whether the cards a node gives are still to be checked one by one (a profile
    that asks for a class, card memory or compute, or more cards than the table counts: of
    those, only the nodes with as many free cards, the roomiest roomy enough, are passed)."""
    ok = table.free_mb[at] >= need.memory_mb
    if cores := need.profile.cpu_cores:
        ok &= table.free_cores[at] >= cores
    if label := need.profile.keep_within:
        ok &= table.labelled(label)[at]
    if not need.cards:
        return ok, False
    if any_cards(need):
        return ok & (table.room_for[need.cards - 1][at] >= need.card_mb), False
    return ok & (table.cards[at] >= need.cards) & (table.card_most[at] >= need.card_mb), True


def _scan_indexed(need: Need, when: tuple[float, float], first: int, limit: int, index: Index) -> Found:
    """`scan` visiting only the nodes the index does not skip for the need, a stretch at a time."""
    kind, table = index.kind(need, index.nodes), index.table
    visit = kind[0]
    choice, states = need.card_choice, index.states
    fit: list[np.ndarray] = []
    found = 0
    refused: list[np.ndarray] = []
    last = None
    for lo, hi in _stretches(len(visit), int(np.searchsorted(visit, first)), limit):
        at = visit[lo:hi]
        ok, check = _passing(need, table, at)
        if check:  # the cards a node gives, judged one by one
            for j in ok.nonzero()[0].tolist():
                n = states[at[j]]
                chosen = _UNKNOWN if n.chosen is None else n.chosen.get(choice, _UNKNOWN)
                if (chosen if chosen is not _UNKNOWN else chosen_cards(need, n)) is None:
                    ok[j] = False
        js = ok.nonzero()[0]
        end = len(at)  # where this stretch's scan stopped (past its last node: it did not)
        if limit and found + len(js) >= limit:
            js = js[: limit - found]
            end = int(js[-1]) + 1
        fit.append(at[js])
        found += len(js)
        refused.append(at[:end][~ok[:end]])
        if limit and found == limit:
            last = int(at[end - 1])
            break
    reasons = Reasons()
    _add_unvisited(reasons, need, (index, kind), when, (first, last), refused)
    return Found(table, index.names, np.concatenate(fit) if fit else np.zeros(0, np.intp), reasons)


def _add_unvisited(
    reasons: Reasons,
    need: Need,
    of: tuple[Index, _Kind],
    when: tuple[float, float],
    scanned: tuple[int, int | None],
    refused: list[np.ndarray],
) -> None:
    """Put among `reasons`, when they are read, the nodes the index skipped within the stretch
    scanned (`scanned`: from the first position to the last, wrapping; all of it where the last
    is None) and those the scan refused (`refused`: their positions), with what they had free.
    `of`: the index, and what it keeps for the need's kind."""
    first, last = scanned
    index, (_, skip, said) = of
    if last is None:
        stretches = [(0, len(skip))]
    elif first <= last:
        stretches = [(bisect.bisect_left(skip, first), bisect.bisect_right(skip, last))]
    else:
        stretches = [(bisect.bisect_left(skip, first), len(skip)), (0, bisect.bisect_right(skip, last))]
    skipped = sum(hi - lo for lo, hi in stretches)
    at = np.concatenate(refused) if refused else np.zeros(0, np.intp)
    if not skipped and not len(at):
        return
    t = index.table  # what the refused nodes had free, as they are now
    had = (t.free_mb[at], t.free_cores[at], t.version[at] if need.cards else None)
    names, states, count = index.names, index.states, len(index.names)

    def merge(seen: dict) -> dict:
        out = [((index.position[name] - first) % count, name, v) for name, v in seen.items()]
        for lo, hi in stretches:
            for s in range(lo, hi):
                label, why = said[s]
                i = skip[s]
                out.append(((i - first) % count, names[i], (label, why or _CARDS(need, states[i], *when))))
        for k, i in enumerate(at.tolist()):
            out.append(((i - first) % count, names[i], _refusal(need, index, i, had, k, when)))
        out.sort(key=lambda e: e[0])
        return {name: v for _, name, v in out}

    reasons.skipped(skipped + len(at), merge)


def _refusal(need: Need, index: Index, i: int, had: tuple, k: int, when: tuple[float, float]) -> tuple[str, Why]:
    """The first filter to refuse node `i` as it was when scanned (`had`, its `k`-th entries:
    free memory, cores and the version of its free cards), and why: the chain's own words."""
    n = index.states[i]
    free_mb, free_cores, versions = had
    then = NodeState(
        info=n.info,
        last_seen=n.last_seen,
        free_mb=int(free_mb[k]),
        cores_held=n.info.cpus - int(free_cores[k]),
        free_cards=index.table.cards_then(i, int(versions[k])) if versions is not None else n.free_cards,
    )
    for label, f in chain(need):
        if label in JUDGED and (why := f(need, then, *when)):
            return label, why
    raise AssertionError(f"node {index.names[i]} was refused, but no filter refuses it")
