"""A table of node states: what the scan judges and the scorers rank by, a numpy column each, by
position. A pass's `Index` keeps one of the whole fleet, told of every change (`Rooms`); a scan
without one makes one of the nodes that fit."""

from __future__ import annotations

import numpy as np

from llmgw.modelplan import card_room, class_bandwidth
from llmgw.proto import CpuCalibration, GpuInfo
from llmgw.scheduler.placement._room import Need, NodeState, domain_of

__all__ = ["ROOM_COUNTS", "Table", "any_cards"]

ROOM_COUNTS = 8
"""The replicas of up to this many cards the table says the room of (`Table.room_for`)."""
_MOST = 2**62
"""A figure a node reports beyond this (MiB, cores) is kept as this: the columns are 64-bit
integers and a heartbeat's are not bounded above (no node has 2**62 MiB; sums stay in range)."""


def _capped(figure: int) -> int:
    return figure if -_MOST <= figure <= _MOST else max(-_MOST, min(figure, _MOST))


def any_cards(need: Need) -> bool:
    """Whether `need` asks only for a number of cards (1 to `ROOM_COUNTS`), of no class, card
    memory or compute in particular: what the table's card columns answer exactly."""
    p = need.profile
    return 0 < need.cards <= ROOM_COUNTS and not (p.gpu_class or p.min_card_mb or p.min_compute)


class Table:
    """Node states by position, and their columns. The free room (memory, cores, cards) is read
    again whenever a node changes (`row`); the rest (labels, files held, memory rates) is what
    a node is, the same all pass long."""

    def __init__(self, states: list[NodeState]) -> None:
        self.states = states
        count = len(states)
        self.free_mb = np.zeros(count, np.int64)
        self.free_cores = np.zeros(count, np.int64)
        self.cards = np.zeros(count, np.int64)
        """Free cards."""
        self.card_most = np.zeros(count, np.int64)
        """The free room of the roomiest free card (MiB; 0: none free)."""
        self.room_for = np.full((ROOM_COUNTS, count), -1, np.int64)
        """`room_for[k - 1]`: the most room k free cards of one class each have (MiB; -1: no class
        has k free): a replica of k cards, each needing that much, of any class, fits there."""
        self.fast_class = np.full((ROOM_COUNTS, count), -1, np.int64)
        self.fast_room = np.full((ROOM_COUNTS, count), -1, np.int64)
        """`[k - 1]`: the fastest class (most bandwidth) of which k cards are free, by its number in
        `classes` (-1: none, or two as fast), and the room of its k-th roomiest: where that is
        room enough, a replica of k cards of any class takes cards of that class."""
        self.card_class = np.full(count, -1, np.int64)
        """The one class all free cards are of, by its number in `classes` (-1: none, or several)."""
        self.free_cards = np.empty(count, object)
        """Each node's free cards (a list of `GpuInfo`; placing replaces it, never changes it)."""
        self.version = np.zeros(count, np.int64)
        """How often each node's free cards changed: with it, `cards_then` gives those it had."""
        self._was: dict[tuple[int, int], list[GpuInfo]] = {}
        self._alike: dict[tuple, tuple] = {}
        self.classes: dict[str, int] = {}
        for i, n in enumerate(states):
            self.row(i, n)
        self.all_gbs = np.fromiter((n.info.membw_all_gbs or 0.0 for n in states), float, count)
        self.one_gbs = np.fromiter((n.info.membw_one_gbs or 0.0 for n in states), float, count)
        self.cpus = np.fromiter((_capped(n.info.cpus) for n in states), np.int64, count)
        """What a CPU replica's speed takes of each node: its memory rates (0: unknown) and CPUs."""
        self.calibration: list[CpuCalibration | None] = [n.info.cpu_calibration for n in states]
        self.class_speeds: dict[tuple, np.ndarray] = {}
        """A card replica's speed by card class (its number in `classes`), by what it takes of its need."""
        self.speeds: dict[tuple, np.ndarray] = {}
        """A CPU replica's speed on each node (NaN: not yet worked out), by what it takes of its need."""
        self._labelled: dict[str, np.ndarray] = {}
        self._domains: dict[str, tuple[np.ndarray, dict[str, int]]] = {}
        self._holders: dict[str, set[int]] | None = None

    def row(self, i: int, n: NodeState) -> None:
        """Read the free room of node `n`, at position `i`, again."""
        self.states[i] = n
        self.free_mb[i] = _capped(n.free_mb)
        self.free_cores[i] = _capped(n.info.cpus - n.cores_held)
        if n.free_cards is not self.free_cards[i]:  # (placing replaces the list, never changes it)
            self._cards(i, n.free_cards)

    def _cards(self, i: int, free: list[GpuInfo]) -> None:
        """The card columns of the node at position `i`, whose free cards are `free`."""
        if not free and not self.cards[i]:  # none free, as before: the columns say so already
            self.free_cards[i] = free
            return
        if (before := self.free_cards[i]) is not None:
            self._was[i, int(self.version[i])] = before
            self.version[i] += 1
        self.free_cards[i] = free
        self.cards[i] = len(free)
        # nodes of alike free cards (their classes and room) have alike columns: worked out once
        alike = tuple((g.cls, card_room(g)) for g in free)
        columns = self._alike.get(alike)
        if columns is None:
            columns = self._alike[alike] = self._columns(free)
        self.room_for[:, i], self.fast_class[:, i], self.fast_room[:, i], self.card_most[i], self.card_class[i] = (
            columns
        )

    def _columns(self, free: list[GpuInfo]) -> tuple[list[int], list[int], list[int], int, int]:
        """A node's card columns (`room_for`, `fast_class`, `fast_room`, `card_most`,
        `card_class`), its free cards being `free`."""
        rooms: dict[str, list[int]] = {}
        for g in free:
            if (room := card_room(g)) is not None:
                rooms.setdefault(g.cls, []).append(_capped(room))
        most = [-1] * ROOM_COUNTS
        for room in rooms.values():
            room.sort(reverse=True)
            for k, mb in enumerate(room[:ROOM_COUNTS]):
                most[k] = max(most[k], mb)
        one = len(rooms) == 1 and len(free) == len(next(iter(rooms.values())))
        single = self.classes.setdefault(free[0].cls, len(self.classes)) if one else -1
        return most, *self._fastest(rooms), max(most[0], 0), single

    def cards_then(self, i: int, version: int) -> list[GpuInfo]:
        """The free cards the node at position `i` had at that `version` of them."""
        return self.free_cards[i] if self.version[i] == version else self._was[i, version]

    def _fastest(self, rooms: dict[str, list[int]]) -> tuple[list[int], list[int]]:
        """`fast_class` and `fast_room` of a node whose free cards of each class have `rooms`
        (most first)."""
        fast, room = [-1] * ROOM_COUNTS, [-1] * ROOM_COUNTS
        if len(rooms) == 1:  # (most nodes)
            cls, most = next(iter(rooms.items()))
            k = min(len(most), ROOM_COUNTS)
            fast[:k], room[:k] = [self.classes.setdefault(cls, len(self.classes))] * k, most[:k]
            return fast, room
        by_speed = sorted(((class_bandwidth(cls), cls) for cls in rooms), reverse=True)
        for k in range(ROOM_COUNTS):
            having = [(bandwidth, cls) for bandwidth, cls in by_speed if len(rooms[cls]) > k]
            if having and (len(having) == 1 or having[1][0] < having[0][0]):
                cls = having[0][1]
                fast[k], room[k] = self.classes.setdefault(cls, len(self.classes)), rooms[cls][k]
        return fast, room

    def labelled(self, label: str) -> np.ndarray:
        """Which nodes carry `label`."""
        has = self._labelled.get(label)
        if has is None:
            has = self._labelled[label] = np.fromiter((label in n.info.labels for n in self.states), bool)
        return has

    def domains(self, label: str) -> tuple[np.ndarray, dict[str, int]]:
        """Each node's failure domain (its `label`'s value, else its own name) by number, and
        the numbers of the domains."""
        known = self._domains.get(label)
        if known is None:
            ids: dict[str, int] = {}
            of = [ids.setdefault(domain_of(n, label), len(ids)) for n in self.states]
            known = self._domains[label] = (np.array(of, np.int64), ids)
        return known

    def holding(self, source: str) -> set[int]:
        """The nodes that hold the file `source`."""
        if self._holders is None:
            self._holders = {}
            for i, n in enumerate(self.states):
                for held in n.weights:
                    self._holders.setdefault(held, set()).add(i)
        return self._holders.get(source, set())
