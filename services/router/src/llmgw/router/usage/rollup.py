"""Usage summed as it arrives, and reports that read those sums: pure (no I/O, no clock); the
reading and writing is `usage.py`'s.

Reading every request of a day back from the usage stream costs about a minute at 10 million
requests, so every router also sums the stream into slots of `USAGE_SLOT_S` seconds per model,
project, key and replica (`UsageSlot` entries in the usage-slots bucket), and a report adds a
day's 288 slots to the few minutes of stream they do not hold yet.

A slot is made the same way by every router, restarted or not, so they all write the same entry:
a request goes to the slot its time falls in (`at`: its `time`, kept within the stream's
clock's bounds); a slot opens at the first message holding one of its
requests and closes at the first message holding a request that ended `USAGE_SLOT_GRACE_S`
after the slot (`Roller.horizon` passes it), and its sums up to that message are written once. A
request of a closed slot that comes later (a router's clock behind, a message held up) is added
to the entry with `upto` moved to its message: an entry holds every request of its slot and part
in the messages up to `upto`. Where a router resumes (`UsageRolled`) is the first message of the
oldest slot still open, with the horizon as it was there, so what it decides again is what was
decided the first time.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from llmgw.proto import UsageQuery, UsageRecord, UsageRolled, UsageRow, UsageSlot
from llmgw.proto.router import USAGE_MOST_LATE_S, USAGE_SLOT_GRACE_S, USAGE_SLOT_S, usage_order

__all__ = [
    "GROUPS",
    "PART_BYTES",
    "Closed",
    "Late",
    "Roller",
    "Tally",
    "add_late",
    "at",
    "slot_of",
    "slot_parts",
    "usage_part",
]

GROUPS = ("model", "project", "key", "replica", "tenant")
"""What a report groups by: each slot keeps its sums per value of each."""
PART_BYTES = 256 * 1024
"""A slot's sums bigger than this (JSON) are split over several entries (NATS takes 1 MB a message)."""

Sums = dict[str, dict[str, list[int]]]
"""Group (model, project, key, replica) -> its value -> [requests, errors, prompt, cached, completion]."""


def at(record: UsageRecord, stored: float) -> float:
    """When a request counts: when it ended, within `USAGE_SLOT_GRACE_S` after and
    `USAGE_MOST_LATE_S` before the stream kept it (`stored`, the stream's clock): a router's
    clock far off moves nothing else."""
    return max(min(record.time, stored + USAGE_SLOT_GRACE_S), stored - USAGE_MOST_LATE_S)


def slot_of(t: float) -> int:
    """The start of the slot time `t` falls in."""
    return int(t // USAGE_SLOT_S) * USAGE_SLOT_S


def usage_part(group: str, value: str, parts: int) -> int:
    """Which of a slot's `parts` entries keeps `value` of `group`."""
    return zlib.crc32(f"{group}\0{value}".encode()) % parts if parts > 1 else 0


def _add(sums: Sums, record: UsageRecord, groups: Iterable[str] = GROUPS) -> None:
    for group in groups:
        row = sums.setdefault(group, {}).setdefault(getattr(record, group), [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += record.status >= 400
        row[2] += record.prompt_tokens
        row[3] += record.cached_tokens
        row[4] += record.completion_tokens


def slot_parts(start: int, first: int, upto: int, sums: Sums, most: int = PART_BYTES) -> list[UsageSlot]:
    """A closed slot's entries: per group, one, or its sums split by `usage_part` where they are
    bigger than `most` bytes (the same split on every router: it depends on the sums alone)."""
    entries = []
    for group in GROUPS:
        values = sums.get(group, {})
        size = len(msgspec.json.encode(values))
        parts = 1 if size <= most else math.ceil(size * 1.5 / most)
        split: list[dict[str, list[int]]] = [{} for _ in range(parts)]
        for value, row in values.items():
            split[usage_part(group, value, parts)][value] = row
        entries += [
            UsageSlot(start=start, group=group, first=first, upto=upto, part=i, parts=parts, sums=s)
            for i, s in enumerate(split)
        ]
    return entries


def add_late(entry: UsageSlot, late: list[tuple[int, UsageRecord]]) -> UsageSlot | None:
    """`entry` with the late requests (stream sequence, request) of its group's part that it does
    not hold yet added, `upto` moved to the last; None where it holds them all already."""
    new = [(seq, r) for seq, r in late if seq > entry.upto]
    if not new:
        return None
    sums = {entry.group: {value: list(row) for value, row in entry.sums.items()}}
    for _, record in new:
        if usage_part(entry.group, getattr(record, entry.group), entry.parts) == entry.part:
            _add(sums, record, (entry.group,))
    return msgspec.structs.replace(entry, upto=max(seq for seq, _ in new), sums=sums[entry.group])


@dataclass
class _Open:
    """A slot being summed."""

    first: int
    horizon: float
    """`Roller.horizon` before the message at `first`."""
    sums: Sums = field(default_factory=dict)


@dataclass(frozen=True)
class Closed:
    """A slot closed: its entries, to be written once."""

    start: int
    entries: list[UsageSlot]


@dataclass(frozen=True)
class Late:
    """Requests of a closed slot that came after it closed: to be added to its entries."""

    start: int
    records: list[tuple[int, UsageRecord]]
    """(stream sequence, request), in stream order."""


class Roller:
    """Sums the usage stream's messages, fed in order from `resume`, into slots."""

    def __init__(self, resume: int = 1, horizon: float = 0.0) -> None:
        self.next = resume
        """The sequence of the next message it expects."""
        self.horizon = horizon
        """The latest request end seen: slots that ended `USAGE_SLOT_GRACE_S` before it are closed."""
        self.open: dict[int, _Open] = {}
        self.requests = 0
        """Requests summed since it started."""

    def closed(self, start: int) -> bool:
        """Whether the slot at `start` is closed (its entries written or to be)."""
        return start + USAGE_SLOT_S + USAGE_SLOT_GRACE_S <= self.horizon

    def feed(self, seq: int, stored: float, records: list[UsageRecord]) -> tuple[list[Late], list[Closed]]:
        """One message (`stored`: when the stream kept it): the late requests it holds, by slot,
        and the slots it closes (oldest first)."""
        late: dict[int, list[tuple[int, UsageRecord]]] = {}
        latest = self.horizon
        for record in records:
            t = at(record, stored)
            start = slot_of(t)
            latest = max(latest, t)
            if (slot := self.open.get(start)) is not None:
                _add(slot.sums, record)
            elif self.closed(start):
                late.setdefault(start, []).append((seq, record))
            else:
                self.open[start] = slot = _Open(first=seq, horizon=self.horizon)
                _add(slot.sums, record)
        self.horizon = latest
        self.next = seq + 1
        self.requests += len(records)
        done = sorted(s for s in self.open if self.closed(s))
        closed = [Closed(s, slot_parts(s, (o := self.open.pop(s)).first, seq, o.sums)) for s in done]
        return [Late(s, rs) for s, rs in late.items()], closed

    def rolled(self) -> UsageRolled:
        """Where a router summing would resume: the first message of the oldest open slot (with the
        horizon there), or the next message."""
        if not self.open:
            return UsageRolled(resume=self.next, horizon=self.horizon)
        oldest = min(self.open.values(), key=lambda o: o.first)
        return UsageRolled(resume=oldest.first, horizon=oldest.horizon)


class Tally:
    """A report being summed from slots' entries and the stream's requests they do not hold.

    `slots`: the entries by the report's group read (slot start -> its parts, in part order), for
    every slot from the one holding `since` on; `resume`: the rolled mark read before them. A request read from the
    stream is counted where no entry holds it: in the slot `since` falls in (the edge, whose
    entries cannot be split at `since`), always; in a slot with entries, past its part's `upto`;
    in one without, from `resume` on. Each message must be given once."""

    def __init__(self, query: UsageQuery, slots: Mapping[int, list[UsageSlot]], resume: int) -> None:
        self.query, self.slots, self.resume = query, slots, resume
        self.edge = slot_of(query.since) if query.since % USAGE_SLOT_S else None
        """The slot `since` falls inside of (None: `since` starts a slot)."""
        self.rows: dict[tuple[float, str], UsageRow] = {}
        for start, parts in slots.items():
            if start != self.edge and start >= query.since:
                for part in parts:
                    for value, sums in part.sums.items():
                        self._add(start, value, sums)

    def edge_range(self) -> tuple[int, int] | None:
        """The stream sequences that hold the requests of the edge slot its entries hold (read
        them besides the stream from `resume`), or None."""
        parts = self.slots.get(self.edge) if self.edge is not None else None
        return (parts[0].first, max(p.upto for p in parts)) if parts else None

    def count(self, seq: int, stored: float, records: list[UsageRecord]) -> None:
        """The requests of one message read from the stream."""
        query = self.query
        for record in records:
            t = at(record, stored)
            if t < query.since:
                continue
            start = slot_of(t)
            value = getattr(record, query.group_by)
            if start != self.edge:
                parts = self.slots.get(start)
                if parts:
                    if seq <= parts[usage_part(query.group_by, value, len(parts))].upto:
                        continue
                elif seq < self.resume:
                    continue
            self._add(
                t,
                value,
                [1, record.status >= 400, record.prompt_tokens, record.cached_tokens, record.completion_tokens],
            )

    def _add(self, t: float, group: str, sums: list[int]) -> None:
        bucket = self.query.bucket_s
        start = float(t // bucket * bucket) if bucket else 0.0
        row = self.rows.get((start, group))
        if row is None:
            self.rows[start, group] = row = UsageRow(group=group, start=start)
        row.requests += sums[0]
        row.errors += sums[1]
        row.prompt_tokens += sums[2]
        row.cached_tokens += sums[3]
        row.completion_tokens += sums[4]

    def report(self) -> list[UsageRow]:
        """The rows, as a report lists them (`usage_order`)."""
        return usage_order(list(self.rows.values()))
