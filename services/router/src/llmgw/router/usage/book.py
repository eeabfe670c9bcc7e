"""The usage stream read back: its requests summed into slots as they arrive (every router), and
reports from those sums and the stream after them (`rollup.py` decides; this reads and writes;
`stream_reader.py` reads the stream, never stopped by unacknowledged messages)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import get_logger, kv_bucket, spawn
from llmgw.proto import (
    BUCKETS,
    USAGE_STREAM,
    UsageQuery,
    UsageRecord,
    UsageReport,
    UsageRolled,
    UsageRow,
    UsageSlot,
    page_of,
)
from llmgw.proto import usage_records as decode_usage
from llmgw.proto.people import DEFAULT_TENANT
from llmgw.proto.router import USAGE_MOST_LATE_S, USAGE_SLOT_GRACE_S, USAGE_SLOT_S
from llmgw.router.usage.rollup import GROUPS, Closed, Late, Roller, Tally, add_late, slot_of
from llmgw.router.usage.stream_reader import PULL, StreamReader

__all__ = ["GIVE_BACK", "ROLL_IDLE_S", "ROLL_PULL", "UsageBook"]

ROLL_PULL = 500
"""Messages summed at a time (a few milliseconds of the router's loop each)."""
ROLL_IDLE_S = 1.0
"""How long summing waits before asking again once it has read the whole stream."""
GIVE_BACK = 256
"""Requests summed (or counted for a report) before the event loop is given back to whatever
else the process does: about a millisecond."""
_ROLLED = "rolled"
_GETS = 64
"""Slots' entries asked for at once."""
_AHEAD_S = 3600.0
"""Slots looked for after this router's clock's now (the stream's clock may be ahead of it)."""
_KEPT_S = 60.0
"""How long a report paged through is kept for the pages after the first."""
_KEPT = 8
"""The most reports kept so."""
_TRIES = 20
"""Compare-and-set tries before giving up (another router writing the same entry each time)."""


def _row_place(row: UsageRow) -> tuple[float, str]:
    """Where a row is in a report's pages: its bucket's start, then its group."""
    return row.start, row.group


def _records(data: bytes) -> list[UsageRecord]:
    try:
        return decode_usage(data)
    except msgspec.DecodeError:
        return []  # not a usage message: nothing to count


def _before_tenants(start: int, by_model: list[UsageSlot]) -> UsageSlot:
    """A slot summed before tenants (by a router without them: it has no entries by tenant), as
    its entry by tenant: every request it holds is the default tenant's."""
    total = [sum(row[i] for part in by_model for row in part.sums.values()) for i in range(5)]
    upto = max(part.upto for part in by_model)
    return UsageSlot(start=start, group="tenant", first=by_model[0].first, upto=upto, sums={DEFAULT_TENANT: total})


class _Pace:
    """Gives the event loop back every `GIVE_BACK` requests summed."""

    def __init__(self) -> None:
        self.owed = 0

    async def done(self, requests: int) -> None:
        self.owed += requests
        if self.owed >= GIVE_BACK:
            self.owed = 0
            await asyncio.sleep(0)


class UsageBook:
    """Reports of the usage stream, and summing it into slots as it arrives (`roll`)."""

    def __init__(self, nc: Client, js: JetStreamContext, slots: KeyValue) -> None:
        self.nc, self.js, self.slots = nc, js, slots
        self.log = get_logger("router")
        self.tasks: set[asyncio.Task] = set()
        self.roller: Roller | None = None
        """The summing's state (None until it starts)."""
        self.summed = 0
        """The sequence after the last message summed, with what it closed written."""
        self.read = 0
        """How many stream messages the last report read."""
        self._kept: dict[bytes, tuple[float, list[UsageRow]]] = {}
        """Reports lately paged through, by query: when summed, their rows."""

    @classmethod
    async def open(cls, nc: Client, js: JetStreamContext, usage_days: int, roll: bool = True) -> UsageBook:
        """Open the slots bucket (its values expire with the stream's) and, with `roll`, start summing."""
        slots = await kv_bucket(js, BUCKETS["usage_slots"], ttl=(usage_days + 1) * 86400.0)
        book = cls(nc, js, slots)
        if roll:
            spawn(book.tasks, book.roll(), book.log, "summing the usage stream into slots")
        return book

    def stop(self) -> None:
        """Stop summing."""
        for task in self.tasks:
            task.cancel()

    # -- reports ---------------------------------------------------------------------------------
    async def report(self, query: UsageQuery, now: float) -> UsageReport:
        """Every request since `query.since`: the slots' sums where they hold it, the stream where
        not (`Tally` says which); each stream message read once."""
        if query.bucket_s % USAGE_SLOT_S:  # buckets that cut slots: every request from the stream
            return await self.scan(query)
        self.read = 0
        rolled = await self._rolled()
        resume = rolled.resume if rolled else 0
        # the first message that may hold a request since `since` (kept at most the grace before it)
        tail = await StreamReader(self.nc, self.js, USAGE_STREAM).open(since=query.since - USAGE_SLOT_GRACE_S)
        try:
            if (head := await tail.peek()) is None:
                return UsageReport(rows=[])
            lowest = slot_of(max(query.since, head[1] - USAGE_MOST_LATE_S))  # no request counts before
            starts = range(lowest, slot_of(now + _AHEAD_S) + USAGE_SLOT_S, USAGE_SLOT_S)
            tally = Tally(query, await self._entries(list(starts), query.group_by), resume)
            if head[0] < resume:  # what is before `resume` is in the slots' sums
                await tail.close()
                tail = await StreamReader(self.nc, self.js, USAGE_STREAM).open(seq=resume)
                head = await tail.peek()
            if (edge := tally.edge_range()) is not None:  # up to where the tail starts: each message once
                first, last = edge
                await self._read(tally, first, last if head is None else min(last, head[0] - 1))
            await self._drain(tally, tail)
        finally:
            await tail.close()
        return UsageReport(rows=tally.report())

    async def report_page(self, query: UsageQuery, now: float) -> UsageReport:
        """A report as NATS answers it: whole where it fits in one message (`limit` 0), else a page
        of its rows by bucket start, then group. The pages after a caller's first come from the
        report that first one was summed into (kept `_KEPT_S`), so they add up to one report."""
        whole = msgspec.structs.replace(query, after="", limit=0)
        key = msgspec.json.encode(whole)
        kept = self._kept.get(key) if query.after else None
        if kept is None or time.monotonic() - kept[0] > _KEPT_S:
            kept = self._kept[key] = (time.monotonic(), (await self.report(whole, now)).rows)
            while len(self._kept) > _KEPT:
                self._kept.pop(next(iter(self._kept)))
        rows = kept[1]
        if query.limit or query.after:
            rows = sorted(rows, key=_row_place)
        page, after = page_of(rows, query, _row_place, "the usage report")
        return UsageReport(rows=page, next=after)

    async def scan(self, query: UsageQuery) -> UsageReport:
        """Every request since `query.since` read from the stream alone (no slot's sums): the
        reference a report equals, and what answers buckets that cut slots."""
        self.read, tally = 0, Tally(query, {}, 0)
        reader = await StreamReader(self.nc, self.js, USAGE_STREAM).open(since=query.since - USAGE_SLOT_GRACE_S)
        try:
            await self._drain(tally, reader)
        finally:
            await reader.close()
        return UsageReport(rows=tally.report())

    async def _drain(self, tally: Tally, reader: StreamReader) -> None:
        """Every message from `reader` on given to `tally`."""
        pace = _Pace()
        while batch := await reader.pull():
            self.read += len(batch)
            for seq, stored, data in batch:
                tally.count(seq, stored, records := _records(data))
                await pace.done(len(records))

    async def _read(self, tally: Tally, first: int, last: int) -> None:
        """Messages `first` to `last` given to `tally`."""
        if last < first:
            return
        reader = await StreamReader(self.nc, self.js, USAGE_STREAM).open(seq=first)
        try:
            at, pace = first, _Pace()
            while at <= last and (batch := await reader.pull(min(PULL, last + 1 - at))):
                self.read += len(batch)
                for seq, stored, data in batch:
                    if seq > last:
                        return
                    tally.count(seq, stored, records := _records(data))
                    await pace.done(len(records))
                at = batch[-1][0] + 1
        finally:
            await reader.close()

    async def _rolled(self) -> UsageRolled | None:
        try:
            entry = await self.slots.get(_ROLLED)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return msgspec.json.decode(entry.value, type=UsageRolled)

    async def _entries(self, starts: list[int], group: str) -> dict[int, list[UsageSlot]]:
        """The entries by `group` of the slots at `starts` that have them (every part)."""
        out: dict[int, list[UsageSlot]] = {}
        for i in range(0, len(starts), _GETS):
            chunk = starts[i : i + _GETS]
            for start, parts in zip(chunk, await asyncio.gather(*(self._parts(s, group) for s in chunk)), strict=True):
                if parts:
                    out[start] = [entry for entry, _ in parts]
                elif group == "tenant" and (by_model := await self._parts(start, "model")):
                    out[start] = [_before_tenants(start, [entry for entry, _ in by_model])]
        return out

    async def _parts(self, start: int, group: str) -> list[tuple[UsageSlot, int]]:
        """A slot's entries by `group` (every part) with their revisions, [] where it has none."""
        first = await self._get(f"{start}.{group}.0")
        if first is None:
            return []
        rest = await asyncio.gather(*(self._get(f"{start}.{group}.{i}") for i in range(1, first[0].parts)))
        return [first, *(r for r in rest if r is not None)]

    async def _get(self, key: str) -> tuple[UsageSlot, int] | None:
        try:
            entry = await self.slots.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return msgspec.json.decode(entry.value, type=UsageSlot), entry.revision

    # -- summing as it arrives -------------------------------------------------------------------
    async def roll(self) -> None:
        """Sum the stream into slots from where the routers left off, for as long as it runs;
        on a failure (NATS gone a while), start again from the rolled mark."""
        while True:
            try:
                await self._roll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("summing usage into slots stopped; starting again", error=str(exc))
                await asyncio.sleep(5.0)

    async def _roll(self) -> None:
        rolled = await self._rolled() or UsageRolled(resume=1)
        first = (await self.js.stream_info(USAGE_STREAM)).state.first_seq
        self.roller = roller = Roller(max(rolled.resume, first), rolled.horizon)
        reader = await StreamReader(self.nc, self.js, USAGE_STREAM).open(seq=roller.next)
        pace = _Pace()
        try:
            while True:
                batch = await reader.pull(ROLL_PULL)
                if not batch:
                    await asyncio.sleep(ROLL_IDLE_S)
                    continue
                late: dict[int, list[tuple[int, UsageRecord]]] = {}
                closed: list[Closed] = []
                for seq, stored, data in batch:
                    some_late, some_closed = roller.feed(seq, stored, records := _records(data))
                    await pace.done(len(records))
                    for item in some_late:
                        late.setdefault(item.start, []).extend(item.records)
                    closed += some_closed
                for c in closed:  # first: a late request of a slot closed in this batch comes after
                    await self._write(c.entries)
                for start, records in late.items():  # before the mark moves past them
                    await self._add_late(Late(start, records))
                if closed:
                    await self._mark(roller.rolled())
                self.summed = roller.next
        finally:
            await reader.close()

    async def _write(self, entries: list[UsageSlot]) -> None:
        """A closed slot's entries, written once (where another router wrote them: the same)."""
        for entry in entries:
            with contextlib.suppress(KeyWrongLastSequenceError):
                await self.slots.create(f"{entry.start}.{entry.group}.{entry.part}", msgspec.json.encode(entry))

    async def _add_late(self, late: Late) -> None:
        """Add requests that came after their slot closed to its entries of every group
        (compare-and-set; made, one part, where the slot closed empty)."""
        for group in GROUPS:
            await self._add_late_by(late, group)

    async def _add_late_by(self, late: Late, group: str) -> None:
        for _ in range(_TRIES):
            parts = await self._parts(late.start, group)
            try:
                if not parts:
                    first = late.records[0][0]
                    empty = UsageSlot(start=late.start, group=group, first=first, upto=first - 1)
                    await self.slots.create(
                        f"{late.start}.{group}.0", msgspec.json.encode(add_late(empty, late.records))
                    )
                    return
                for entry, revision in parts:
                    if (new := add_late(entry, late.records)) is not None:
                        key = f"{late.start}.{group}.{entry.part}"
                        await self.slots.update(key, msgspec.json.encode(new), last=revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another router added them first (or some): read again
        raise RuntimeError(f"usage slot {late.start} by {group}: its entries kept changing over {_TRIES} tries")

    async def _mark(self, rolled: UsageRolled) -> None:
        """Move the rolled mark forward to `rolled` (never back: another router may be ahead)."""
        for _ in range(_TRIES):
            try:
                entry = await self.slots.get(_ROLLED)
            except (KeyNotFoundError, KeyDeletedError):
                try:
                    await self.slots.create(_ROLLED, msgspec.json.encode(rolled))
                    return
                except KeyWrongLastSequenceError:
                    continue
            if msgspec.json.decode(entry.value, type=UsageRolled).resume >= rolled.resume:
                return
            try:
                await self.slots.update(_ROLLED, msgspec.json.encode(rolled), last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue
        raise RuntimeError(f"usage slots: the rolled mark kept changing over {_TRIES} tries")
