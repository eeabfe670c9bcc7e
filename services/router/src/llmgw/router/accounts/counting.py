"""Limit counters in JetStream KV, shared by every router: how one router's changes of a scope
reach them. Each change is compare-and-set on the entry's revision (one entry per scope, its
format in `counters.py`), so two routers counting at once never lose a count and a limit is never
looser than one router alone keeps it.

Changes waiting on a scope while one is written go in the next write together, each judged in
turn with those before it. Each router's in-flight entry is written from its own count, and one
not heard of for `stale_s` no longer counts: a crashed router, or an end never told, leaks
nothing for long.

While NATS is away (or the counters do not answer within `op_timeout_s`), a router admits from
the last counts it read and its own, counting locally, and writes what it counted once NATS is
back: limits hold for what this router serves; what other routers served meanwhile is unseen.
A write whose answer never came may have landed: its changes are written again unless the
entry, read again, bears its stamp (`Mine.settle`), so that nothing is counted twice."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import get_logger, spawn
from llmgw.proto import Limits
from llmgw.router.accounts import counters
from llmgw.router.accounts.counters import Mine, Op, Snapshot, Terms
from llmgw.router.accounts.limits import Counts, Verdict

__all__ = ["RETRY_S", "Counting"]

RETRY_S = 1.0
"""How soon a write that timed out (NATS there but slow) is tried again."""


class _Asked(NamedTuple):
    """A change waiting for its scope's next write: counted where `check` allows it; `told` its verdict."""

    op: Op
    check: Callable[[Counts], Verdict]
    told: asyncio.Future[Verdict]


def _admit(_: Counts) -> Verdict:
    """The check of a change that is always let in (an end, a refresh)."""
    return Verdict(ok=True)


class Counting:
    """Counts changes of scopes in KV, a batch at a time, or here while NATS is away (see the
    module); what each scope's limits are, as the requests said (`limits`), for the leases."""

    def __init__(
        self, kv: KeyValue, router: str, stale_s: float = 60.0, online: Callable[[], bool] = lambda: True
    ) -> None:
        self.kv, self.router, self.stale_s, self.online = kv, router, stale_s, online
        self.op_timeout_s = 2.0
        """How long a change of the counters may take before it is counted locally."""
        self.end_wait_s = 0.05
        """How long a request's end waits to be written with another change (it only keeps the
        counts stricter meanwhile: the request still counts as in flight)."""
        self.lease_s = 4.0
        """How long the others count a lease this router took (it spends it for half that)."""
        self.flush_s = 1.0
        """How soon what was admitted from a lease is written, renewing it (each write delays requests beside it)."""
        self.limits: dict[str, Limits] = {}
        """Scope -> its limits, as its last request here said (what a lease is taken against)."""
        self.soon: dict[str, asyncio.TimerHandle] = {}
        """Scope -> when the ends waiting on it are written (no other change came first)."""
        self.mine: dict[str, Mine] = {}
        """Scope -> what this router holds there (the truth its KV entry is written from)."""
        self.dirty: set[str] = set()
        """Scopes whose KV entry lacks what this router counted (sent by `keep_alive`)."""
        self.known: dict[str, tuple[dict, int | None]] = {}
        """Scope -> its counters and their revision as last read or written (what the next
        compare-and-set starts from, and what admits while NATS is away)."""
        self.waiting: dict[str, list[_Asked]] = {}
        """Scope -> the changes waiting for its next write."""
        self.writing: set[str] = set()
        """Scopes being written now (one at a time from this router: it races only other routers)."""
        self.stamps = itertools.count(time.time_ns())  # each write's stamp: unique, a restart's too
        self.flying: dict[str, tuple[Snapshot, list[tuple[_Asked, Verdict]]]] = {}
        """Scope -> the write on its way: what it carries of this router's own, the changes it lets in."""
        self.told: tuple[float, float] | None = None
        """The latest time a write was dated, and the loop's time then."""
        self.tasks: set[asyncio.Task] = set()
        self.log = get_logger("router")

    def _counts(self, sid: str, value: dict, now: float, ops: Sequence[Op] = (), leased: bool = True) -> Counts:
        """What the scope has used in `value`, what the others hold (and lease), with what this
        router holds and counted unsent, and `ops` (those before in the same write)."""
        mine = self.mine.get(sid) or Mine()
        counts = counters.others(value, self._terms(), now, [*mine.unsent, *ops], leased)
        return counters.counts_with(counts, mine.n + sum(op.n for op in ops), mine.held + sum(op.held for op in ops))

    def _now(self, at: float) -> float:
        """The time a write is dated (its in-flight entry and its lease): `at`, the latest of its
        changes, or later where time has passed since a later time was told (a batch that waited,
        a refresh of many scopes): the others' clock for a lease must not lag its owner's."""
        now = asyncio.get_running_loop().time()
        if self.told is not None:
            at = max(at, self.told[0] + now - self.told[1])
        self.told = (at, now)
        return at

    def _terms(self) -> Terms:  # who this router is, and how long the others' entries count
        return Terms(self.router, self.stale_s, self.lease_s)

    def _written(self, sid: str, value: dict, ops: list[Op], now: float) -> tuple[dict, Snapshot]:
        """`value` with this router's own in, stamped anew, and its lease taken anew
        (`counters.written`, `Mine.renew`)."""
        mine = self.mine.get(sid) or Mine()
        mine.stamp = next(self.stamps)
        new = counters.written(value, self._terms(), mine, ops, now, self.limits.get(sid))
        mine.renew(new.lease)
        until = asyncio.get_running_loop().time() + self.lease_s / 2
        return new.value, Snapshot(mine.seal(), new, until, mine.stamp)

    def _sent(self, sid: str, snapshot: Snapshot) -> None:
        """A write took this router's own as `snapshot` says (`Mine.sent`)."""
        if self.mine.setdefault(sid, Mine()).sent(snapshot):
            self.dirty.discard(sid)
        self._forget(sid)

    def _forget(self, sid: str) -> None:
        """Drop what this router keeps of a scope where it holds and owes nothing there."""
        mine = self.mine.get(sid)
        if mine is not None and not (mine.n or mine.held or mine.unsent or mine.lease or sid in self.dirty):
            del self.mine[sid]

    def _done(self, sid: str, op: Op, sent: bool) -> None:
        """`op` is counted here; `sent`: KV has it (else it is sent with the scope's next write)."""
        mine = self.mine.setdefault(sid, Mine())
        mine.n, mine.held = max(0, mine.n + op.n), max(0, mine.held + op.held)
        mine.biggest, mine.last_at = max(mine.biggest, op.held), max(mine.last_at, op.at)
        if not sent:
            self.dirty.add(sid)
            if op.requests or op.tokens:
                mine.keep(op)
        self._forget(sid)

    def _due(self, sid: str, after_s: float, then: Callable[[str], None]) -> None:
        if sid not in self.soon:  # `then(sid)` in `after_s`, unless something is due there already
            self.soon[sid] = asyncio.get_running_loop().call_later(after_s, then, sid)

    def _flush(self, sid: str) -> None:
        """Write what this router counted in `sid` (with the next change waiting there, if any)."""
        if sid not in self.waiting and sid in self.mine:
            told: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
            told.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody waits on it
            self.waiting[sid] = [_Asked(Op(at=self.mine[sid].last_at), _admit, told)]
        self._write_soon(sid)

    async def _change(
        self, sid: str, op: Op, check: Callable[[Counts], Verdict] | None = None, wait_s: float = 0.0
    ) -> Verdict:
        """Count `op` in scope `sid`, if `check` (given the counts as they are) allows it: in KV
        by compare-and-set, else (NATS away, no answer in time) here, sent later. Changes that
        come while the scope is being written wait and go in its next write together; `wait_s`:
        this one waits that long for another to start the write. A change whose caller stopped
        waiting (a client gone) is written all the same but not kept as this router's: its next
        write of the scope sets its own entry right."""
        told: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(sid, []).append(_Asked(op, check or _admit, told))
        if wait_s and sid not in self.writing:
            self._due(sid, wait_s, self._write_soon)
        else:
            self._write_soon(sid)
        return await told

    def _write_soon(self, sid: str) -> None:
        """Start writing what waits on `sid` (unless a write of it is under way: it takes them)."""
        if (timer := self.soon.pop(sid, None)) is not None:
            timer.cancel()
        if sid not in self.writing and sid in self.waiting:
            self.writing.add(sid)
            spawn(self.tasks, self._write_waiting(sid), self.log, "counting requests against their limits")

    async def _write_waiting(self, sid: str) -> None:
        """Write what waits on `sid`, a batch at a time, until nothing does."""
        try:
            while batch := self.waiting.pop(sid, None):
                try:
                    await self._write(sid, batch)
                except Exception as exc:  # the requests of this batch hear it (a 500 each); the next go on
                    for asked in batch:
                        if not asked.told.done():
                            asked.told.set_exception(exc)
        finally:
            self.writing.discard(sid)
        if sid in self.dirty and self.online():  # not all in KV (a batch refused, say)
            self._due(sid, self.flush_s, self._flush)

    async def _write(self, sid: str, batch: list[_Asked]) -> None:
        """One batch of changes of `sid`: judged and counted in KV together, else here."""
        if self.online():
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    verdicts, snapshot = await self._cas(sid, batch)
                for asked, verdict in zip(batch, verdicts, strict=True):
                    self._tell(sid, asked, verdict, sent=True)
                if snapshot is not None:  # written: what was unsent went with it
                    self._sent(sid, snapshot)
                return
            except (TimeoutError, NatsError):  # tried again soon: NATS is there, only slow; what the
                self._due(sid, RETRY_S, self._flush)  # write let in is in doubt, the rest counted here below
                batch = self._unanswered(sid, batch)
            except BaseException:
                self._unanswered(sid, batch)  # a write on its way may have landed all the same
                raise
        value = self.known.get(sid, ({}, None))[0]
        for asked in batch:
            self._tell(sid, asked, asked.check(self._counts(sid, value, asked.op.at)), sent=False)

    def _unanswered(self, sid: str, batch: list[_Asked]) -> list[_Asked]:
        """A write whose answer never came may have landed: the changes it let in are let in,
        in doubt until an entry read says (`Mine.unanswered`); the others, returned, are judged here."""
        if (flying := self.flying.pop(sid, None)) is None:
            return batch  # no write was on its way (it failed reading): nothing was written
        snapshot, let_in = flying
        waiting = [(asked, verdict) for asked, verdict in let_in if not asked.told.done()]
        self.mine.setdefault(sid, Mine()).unanswered(snapshot, [asked.op for asked, _ in waiting])
        self.dirty.add(sid)
        for asked, verdict in waiting:
            self._tell(sid, asked, verdict, sent=True)  # its requests and tokens are in doubt, not lost
        return [asked for asked in batch if all(asked is not other for other, _ in let_in)]

    def _tell(self, sid: str, asked: _Asked, verdict: Verdict, sent: bool) -> None:
        """A change judged: counted here where it was let in (and its caller still waits)."""
        if asked.told.done():
            return
        if verdict.ok:
            self._done(sid, asked.op, sent)
        asked.told.set_result(verdict)

    async def _cas(self, sid: str, batch: list[_Asked]) -> tuple[list[Verdict], Snapshot | None]:
        """Judge each change in turn (with those let in before it) and write those let in, only if
        nobody wrote since the revision they were judged on; else read and judge again. A copy
        this router wrote may let a change in (the write fails where it is stale); a refusal is
        judged only on what KV holds now. The snapshot: what of this router's own was written."""
        value, revision = self.known.get(sid, ({}, None))
        read = sid not in self.known
        while True:
            if read:
                value, revision = self.known[sid] = await self._read(sid)
            verdicts: list[Verdict] = []
            taken: list[Op] = []
            for asked in batch:
                verdicts.append(asked.check(self._counts(sid, value, asked.op.at, taken)))
                if verdicts[-1].ok:
                    taken.append(asked.op)
            if len(taken) < len(batch) and not read:
                read = True
                continue
            if not taken:
                return verdicts, None
            written, snapshot = self._written(sid, value, taken, self._now(max(op.at for op in taken)))
            self.flying[sid] = (snapshot, [p for p in zip(batch, verdicts, strict=True) if p[1].ok])
            try:
                if revision is None:
                    revision = await self.kv.create(sid, msgspec.json.encode(written))
                else:
                    revision = await self.kv.update(sid, msgspec.json.encode(written), last=revision)
                self.known[sid] = (written, revision)
                self.flying.pop(sid)
                return verdicts, snapshot
            except KeyWrongLastSequenceError:
                self.flying.pop(sid)
                read = True  # another router wrote since: read it and judge again

    async def _read(self, sid: str) -> tuple[dict, int | None]:
        """The scope's entry as KV has it now (empty where there is none) and its revision; a
        write in doubt that it shows landed is settled (`Mine.settle`), unless a write is on its
        way (it carries what is in doubt, sealed). Only a write's own read keeps it in `known`:
        a write taken from a copy read meanwhile would skip its own read, and the settling."""
        try:
            entry = await self.kv.get(sid)
            value, revision = (msgspec.json.decode(entry.value) if entry.value else {}), entry.revision
        except KeyNotFoundError:
            value, revision = {}, None
        if sid not in self.flying and (mine := self.mine.get(sid)) is not None:
            mine.settle(value, self.router)
        return value, revision

    async def read(self, sid: str, now: float) -> Counts:
        """What scope `sid` has used in the windows that hold `now`, as the counters say (writing
        nothing; leases are not use); from the counts last read where they do not answer in time."""
        value = self.known.get(sid, ({}, None))[0]
        if self.online():
            with contextlib.suppress(TimeoutError, NatsError):  # else the counts last read
                async with asyncio.timeout(self.op_timeout_s):
                    value, _ = await self._read(sid)
        return self._counts(sid, value, now, leased=False)

    def stop(self) -> None:
        """Stop writing (what waits is not counted: the router is going away)."""
        for waits in [*self.soon.values(), *self.tasks]:
            waits.cancel()

    async def keep_alive(self, every_s: float) -> None:
        """Every `every_s`: `refresh`."""
        while True:
            await asyncio.sleep(every_s)
            await self.refresh(time.time())

    async def refresh(self, now: float) -> None:
        """Write this router's in-flight entries again, so long requests keep counting, and what
        was counted here while NATS was away (where it is there now)."""
        for sid in {*self.mine, *self.dirty}:
            if self.online():
                await self._change(sid, Op(at=now))
