"""Limit counters in JetStream KV, shared by every router: each change is compare-and-set on
the entry's revision, so two routers counting at once never lose a count and a limit is
never looser than one router alone would keep it.

One entry per scope (bucket `llmgw_limits`, values expire after 32 days), so admitting a
request is one compare-and-set (on the revision this router last saw; read again only where
another wrote since). The changes waiting on a scope while one is written go in the next write
together, each judged in turn with those before it; a request's end waits up to `end_wait_s`
for a change to go with (the next request's admission, most often), so a client asking one
request after another costs one write each, not two:
  <scope>  {"m": [UTC minute, requests, tokens], "d": [UTC day, tokens],
            "mo": [UTC month, tokens], "c": {router: [in flight, unix time]},
            "h": {router: tokens held by its requests in flight}}
A window whose id is not the current one counts as empty. Tokens are held at admission (the
most the request may use) and settled when it ends (what it used): requests at once never pass
a token limit together. Each router's in-flight entry is written from its own count (never
changed by a delta), and one not heard of for `stale_s` no longer counts: a crashed router, or
an end that could not be told, leaks nothing for long.

While NATS is away (or the counters do not answer within `op_timeout_s`), a router admits from
the last counts it read and its own, counting locally, and writes what it counted once NATS is
back: limits hold for what this router serves; what other routers served meanwhile is unseen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import get_logger, spawn
from llmgw.proto import Limits
from llmgw.router.limits import Counts, Verdict, judge, windows

__all__ = ["Quota", "Scope"]

Scope = tuple[str, str, Limits]
"""(KV key such as "key.ab12...", how a person names it such as "key 'ci'", its limits)."""

_WINDOWS = (("m", "minute", 3), ("d", "day", 2), ("mo", "month", 2))
"""Each window: its field, its name in `windows`, the length of its list."""


class _Op(msgspec.Struct, frozen=True, kw_only=True):
    """A change of one scope's counts, made `at` a time: requests and tokens counted in the
    windows of `when` (where they are still the current ones; None: `at`), this router's
    in-flight count and held tokens changed by `n` and `held`."""

    at: float
    when: float | None = None
    requests: int = 0
    tokens: int = 0
    n: int = 0
    held: int = 0

    @property
    def counted_at(self) -> float:
        """The time whose windows its requests and tokens count in."""
        return self.at if self.when is None else self.when


class _Asked(NamedTuple):
    """A change waiting for its scope's next write: counted where `check` allows it; `told` the
    verdict."""

    op: _Op
    check: Callable[[Counts], Verdict]
    told: asyncio.Future[Verdict]


class _Mine(msgspec.Struct):
    """What this router holds in one scope, and what it counted there that KV has not heard."""

    n: int = 0
    held: int = 0
    unsent: list[_Op] = msgspec.field(default_factory=list)


def _admit(_: Counts) -> Verdict:
    """The check of a change that is always let in (an end, a refresh)."""
    return Verdict(ok=True)


def _counts_tokens(limits: Limits) -> bool:
    """Whether these limits count tokens (requests in flight hold what they may use)."""
    return bool(limits.tokens_per_minute or limits.tokens_per_day or limits.tokens_per_month)


def _holds(limits: Limits) -> bool:
    """Whether requests in flight are counted for these limits (a concurrency or a token limit)."""
    return bool(limits.concurrent) or _counts_tokens(limits)


def _counted(value: dict, ops: list[_Op], now: float) -> dict:
    """The windows of `value` as they stand `now` (an old window empty), with `ops` counted in."""
    current = windows(now)
    out = dict(value)
    for field, name, size in _WINDOWS:
        got = value.get(field)
        window = list(got) if got and got[0] == current[name][0] else [current[name][0]] + [0] * (size - 1)
        for op in ops:
            if windows(op.counted_at)[name][0] == window[0]:
                if field == "m":
                    window[1] = max(0, window[1] + op.requests)
                window[-1] += op.tokens
        out[field] = window
    return out


class Quota:
    """Admits requests against the limits of their key and project, and counts what they used."""

    def __init__(
        self, kv: KeyValue, router: str, stale_s: float = 60.0, online: Callable[[], bool] = lambda: True
    ) -> None:
        self.kv, self.router, self.stale_s, self.online = kv, router, stale_s, online
        self.op_timeout_s = 2.0
        """How long a change of the counters may take before it is counted locally."""
        self.end_wait_s = 0.05
        """How long a request's end waits to be written with another change (it only keeps the
        counts stricter meanwhile: the request still counts as in flight)."""
        self.soon: dict[str, asyncio.TimerHandle] = {}
        """Scope -> when the ends waiting on it are written, where no other change came first."""
        self.mine: dict[str, _Mine] = {}
        """Scope -> what this router holds there (the truth its KV entry is written from)."""
        self.dirty: set[str] = set()
        """Scopes whose KV entry lacks what this router counted (sent by `keep_alive`)."""
        self.known: dict[str, tuple[dict, int | None]] = {}
        """Scope -> its counters and their revision as last read or written (what the next
        compare-and-set starts from, and what admits while NATS is away)."""
        self.waiting: dict[str, list[_Asked]] = {}
        """Scope -> the changes waiting for its next write."""
        self.writing: set[str] = set()
        """Scopes being written now (one write of a scope at a time from this router: its
        compare-and-set then only races other routers, not this one's own requests)."""
        self.tasks: set[asyncio.Task] = set()
        self.log = get_logger("router")

    # -- one change of one scope ----------------------------------------------------------------
    def _counts(self, sid: str, value: dict, now: float, ops: Sequence[_Op] = ()) -> Counts:
        """What the scope has used, with what this router holds and counted unsent, and `ops`
        (those before in the same write)."""
        mine = self.mine.get(sid) or _Mine()
        counted = _counted(value, [*mine.unsent, *ops], now)
        others = {r: v for r, v in value.get("c", {}).items() if r != self.router and now - v[1] < self.stale_s}
        held = value.get("h", {})
        return Counts(
            minute_requests=counted["m"][1],
            minute_tokens=counted["m"][2],
            day_tokens=counted["d"][1],
            month_tokens=counted["mo"][1],
            concurrent=mine.n + sum(op.n for op in ops) + sum(v[0] for v in others.values()),
            reserved=mine.held + sum(op.held for op in ops) + sum(held.get(r, 0) for r in others),
        )

    def _written(self, sid: str, value: dict, ops: list[_Op], now: float) -> dict:
        """`value` with this router's unsent counts and `ops` in, its in-flight entry its own."""
        mine = self.mine.get(sid) or _Mine()
        new = _counted(value, [*mine.unsent, *ops], now)
        n = max(0, mine.n + sum(op.n for op in ops))
        held = max(0, mine.held + sum(op.held for op in ops))
        kept = {r: v for r, v in value.get("c", {}).items() if r != self.router and now - v[1] < self.stale_s}
        new["c"] = {**kept, self.router: [n, now]} if n else kept
        holding = {r: h for r, h in value.get("h", {}).items() if r in kept}
        new["h"] = {**holding, self.router: held} if held else holding
        return new

    def _done(self, sid: str, op: _Op, sent: bool) -> None:
        """`op` is counted here; `sent`: KV has it (and all that was unsent before it)."""
        mine = self.mine.setdefault(sid, _Mine())
        mine.n, mine.held = max(0, mine.n + op.n), max(0, mine.held + op.held)
        if sent:
            mine.unsent.clear()
            self.dirty.discard(sid)
        else:
            self.dirty.add(sid)
            if op.requests or op.tokens:
                mine.unsent.append(op)
        if not (mine.n or mine.held or mine.unsent):
            del self.mine[sid]

    async def _change(
        self, sid: str, op: _Op, check: Callable[[Counts], Verdict] | None = None, wait_s: float = 0.0
    ) -> Verdict:
        """Count `op` in scope `sid`, if `check` (given the counts as they are) allows it: in KV
        by compare-and-set, else (NATS away, no answer in time) here, sent later. Changes that
        come while the scope is being written wait and go in its next write together; `wait_s`:
        this one waits that long for another to start the write. A change whose caller stopped
        waiting (a client gone) is written all the same but not kept as this router's: its next
        write of the scope sets its own entry right."""
        loop = asyncio.get_running_loop()
        told: asyncio.Future[Verdict] = loop.create_future()
        self.waiting.setdefault(sid, []).append(_Asked(op, check or _admit, told))
        if wait_s and sid not in self.writing:
            if sid not in self.soon:
                self.soon[sid] = loop.call_later(wait_s, self._write_soon, sid)
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

    async def _write(self, sid: str, batch: list[_Asked]) -> None:
        """One batch of changes of `sid`: judged and counted in KV together, else here."""
        if self.online():
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    verdicts = await self._cas(sid, batch)
                if any(v.ok for v in verdicts):  # written: what was unsent went with it
                    self._done(sid, _Op(at=0.0), sent=True)
                for asked, verdict in zip(batch, verdicts, strict=True):
                    self._tell(sid, asked, verdict, sent=True)
                return
            except (TimeoutError, NatsError):
                pass  # counted here below, from the counts last read
        value = self.known.get(sid, ({}, None))[0]
        for asked in batch:
            self._tell(sid, asked, asked.check(self._counts(sid, value, asked.op.at)), sent=False)

    def _tell(self, sid: str, asked: _Asked, verdict: Verdict, sent: bool) -> None:
        """A change judged: counted here where it was let in (and its caller still waits)."""
        if asked.told.done():
            return
        if verdict.ok:
            self._done(sid, asked.op, sent)
        asked.told.set_result(verdict)

    async def _cas(self, sid: str, batch: list[_Asked]) -> list[Verdict]:
        """Judge each change in turn (with those let in before it) and write those let in, only if
        nobody wrote since the revision they were judged on; else read and judge again. A copy
        this router wrote may let a change in (the write fails where it is stale); a refusal is
        judged only on what KV holds now."""
        value, revision = self.known.get(sid, ({}, None))
        read = sid not in self.known
        while True:
            if read:
                try:
                    entry = await self.kv.get(sid)
                    value, revision = (msgspec.json.decode(entry.value) if entry.value else {}), entry.revision
                except KeyNotFoundError:
                    value, revision = {}, None
                self.known[sid] = (value, revision)
            verdicts: list[Verdict] = []
            taken: list[_Op] = []
            for asked in batch:
                verdicts.append(asked.check(self._counts(sid, value, asked.op.at, taken)))
                if verdicts[-1].ok:
                    taken.append(asked.op)
            if len(taken) < len(batch) and not read:
                read = True
                continue
            if not taken:
                return verdicts
            written = self._written(sid, value, taken, max(op.at for op in taken))
            try:
                if revision is None:
                    revision = await self.kv.create(sid, msgspec.json.encode(written))
                else:
                    revision = await self.kv.update(sid, msgspec.json.encode(written), last=revision)
                self.known[sid] = (written, revision)
                return verdicts
            except KeyWrongLastSequenceError:
                read = True  # another router wrote since: read it and judge again

    async def read(self, sid: str, now: float) -> Counts:
        """What scope `sid` has used in the windows that hold `now`, as the counters say (changing
        nothing); from the counts last read where they do not answer in time."""
        value = self.known.get(sid, ({}, None))[0]
        if self.online():
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    entry = await self.kv.get(sid)
                value = msgspec.json.decode(entry.value) if entry.value else {}
            except KeyNotFoundError:
                value = {}
            except (TimeoutError, NatsError):
                pass  # the counts last read
        return self._counts(sid, value, now)

    # -- a request's way --------------------------------------------------------------------------
    async def admit(self, scopes: list[Scope], now: float, reserve: int = 0) -> Verdict:
        """Count this request, which may use up to `reserve` tokens, against every scope with
        limits (its tokens held until it ends), or say which limit refuses it (nothing is counted
        then). The headers are those of every scope, the last winning."""
        headers: dict[str, str] = {}
        admitted: list[Scope] = []
        for scope in scopes:
            sid, name, limits = scope
            if limits == Limits():
                continue
            op = _Op(at=now, requests=1, n=int(_holds(limits)), held=reserve if _counts_tokens(limits) else 0)
            verdict = await self._change(
                sid, op, lambda counts, name=name, limits=limits: judge(name, limits, counts, now, reserve)
            )
            if not verdict.ok:
                await self.give_back(admitted, now, now, reserve)
                return verdict
            admitted.append(scope)
            headers.update(verdict.headers)
        return Verdict(ok=True, headers=headers)

    async def finish(self, scopes: list[Scope], tokens: int, now: float, reserve: int = 0) -> None:
        """A request admitted against these scopes, holding `reserve` tokens, ended having used
        `tokens`: one fewer in flight, its hold let go, its tokens added to the minute, the day
        and the month. Written with the scope's next change, or within `end_wait_s`."""
        for sid, _, limits in scopes:
            if _holds(limits):
                held = reserve if _counts_tokens(limits) else 0
                await self._change(sid, _Op(at=now, tokens=tokens, n=-1, held=-held), wait_s=self.end_wait_s)

    async def give_back(self, scopes: list[Scope], admitted: float, now: float, reserve: int = 0) -> None:
        """A request admitted at `admitted` against these scopes was refused after all: the
        request it counted in that minute is taken off again (where that minute is still the
        scope's current one) and its place in flight and its hold freed."""
        for sid, _, limits in scopes:
            if limits == Limits():
                continue
            held = reserve if _counts_tokens(limits) else 0
            await self._change(sid, _Op(at=now, when=admitted, requests=-1, n=-int(_holds(limits)), held=-held))

    def stop(self) -> None:
        """Stop writing (what waits is not counted: the router is going away)."""
        for timer in self.soon.values():
            timer.cancel()
        for task in self.tasks:
            task.cancel()

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
                await self._change(sid, _Op(at=now))
