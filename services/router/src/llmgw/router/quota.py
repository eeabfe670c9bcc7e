"""Limit counters in JetStream KV, shared by every router: each change is compare-and-set on
the entry's revision, so two routers counting at once never lose a count and a limit is
never looser than one router alone would keep it.

One entry per scope (bucket `llmgw_limits`, values expire after 32 days), so admitting a
request is one read and one compare-and-set, and ending it one more:
  <scope>  {"m": [UTC minute, requests, tokens], "d": [UTC day, tokens],
            "mo": [UTC month, tokens], "c": {router: [in flight, unix time]}}
A window whose id is not the current one counts as empty. A router not heard of for
`stale_s` no longer counts in flight: a crashed router leaks nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.proto import Limits
from llmgw.router.limits import Counts, Verdict, judge, windows

__all__ = ["Quota", "Scope"]

Scope = tuple[str, str, Limits]
"""(KV key such as "key.ab12...", how a person names it such as "key 'ci'", its limits)."""


def _window(value: dict, name: str, current: str, size: int) -> list:
    """The counts of window `name` if they are of the current one, else fresh zeros."""
    got = value.get(name)
    return list(got) if got and got[0] == current else [current] + [0] * (size - 1)


class Quota:
    """Admits requests against the limits of their key and project, and counts what they used."""

    def __init__(self, kv: KeyValue, router: str, stale_s: float = 60.0) -> None:
        self.kv, self.router, self.stale_s = kv, router, stale_s
        self.busy: set[str] = set()
        """Scopes with requests in flight here (refreshed in KV by `keep_alive`)."""
        self.locks: dict[str, asyncio.Lock] = {}
        """One change of a scope at a time from this router: compare-and-set then only races
        other routers, not this one's own requests."""

    async def _change(self, key: str, change: Callable[[dict], dict | None]) -> None:
        """Read, change, write back only if nobody wrote in between; else again. `change`
        returning None writes nothing."""
        async with self.locks.setdefault(key, asyncio.Lock()):
            await self._change_now(key, change)

    async def _change_now(self, key: str, change: Callable[[dict], dict | None]) -> None:
        while True:
            try:
                entry = await self.kv.get(key)
                value, revision = (msgspec.json.decode(entry.value) if entry.value else {}), entry.revision
            except KeyNotFoundError:
                value, revision = {}, None
            new = change(value)
            if new is None:
                return
            try:
                if revision is None:
                    await self.kv.create(key, msgspec.json.encode(new))
                else:
                    await self.kv.update(key, msgspec.json.encode(new), last=revision)
                return
            except KeyWrongLastSequenceError:
                continue

    def _in_flight(self, value: dict, now: float, delta: int) -> dict:
        """The in-flight counts with this router's changed by `delta`, stale routers dropped."""
        mine = max(0, value.get("c", {}).get(self.router, [0, 0])[0] + delta)
        kept = {r: v for r, v in value.get("c", {}).items() if r != self.router and now - v[1] < self.stale_s}
        return {**kept, self.router: [mine, now]} if mine else kept

    async def admit(self, scopes: list[Scope], now: float) -> Verdict:
        """Count this request against every scope with limits, or say which limit refuses it
        (nothing is counted then). The headers are those of every scope, the last winning."""
        headers: dict[str, str] = {}
        admitted: list[Scope] = []
        w = windows(now)
        for scope in scopes:
            sid, name, limits = scope
            if limits == Limits():
                continue
            verdict = Verdict(ok=True)

            def count(value: dict, limits=limits, name=name) -> dict | None:
                nonlocal verdict
                minute, day = _window(value, "m", w["minute"][0], 3), _window(value, "d", w["day"][0], 2)
                month = _window(value, "mo", w["month"][0], 2)
                counts = Counts(
                    minute_requests=minute[1],
                    minute_tokens=minute[2],
                    day_tokens=day[1],
                    month_tokens=month[1],
                    concurrent=sum(
                        n
                        for r, (n, seen) in value.get("c", {}).items()
                        if r == self.router or now - seen < self.stale_s
                    ),
                )
                verdict = judge(name, limits, counts, now)
                if not verdict.ok:
                    return None
                minute[1] += 1
                new = {**value, "m": minute, "d": day, "mo": month}
                if limits.concurrent:
                    new["c"] = self._in_flight(value, now, +1)
                return new

            await self._change(sid, count)
            if not verdict.ok:
                await self.give_back(admitted, now, now)
                return verdict
            if limits.concurrent:
                self.busy.add(sid)
            admitted.append(scope)
            headers.update(verdict.headers)
        return Verdict(ok=True, headers=headers)

    async def finish(self, scopes: list[Scope], tokens: int, now: float) -> None:
        """A request admitted against these scopes ended having used `tokens`: one fewer in
        flight, its tokens added to the minute, the day and the month."""
        w = windows(now)
        for sid, _, limits in scopes:
            counts_tokens = tokens > 0 and (
                limits.tokens_per_minute or limits.tokens_per_day or limits.tokens_per_month
            )
            if not (limits.concurrent or counts_tokens):
                continue

            def end(value: dict, limits=limits, counts_tokens=counts_tokens) -> dict:
                new = dict(value)
                if counts_tokens:
                    for name, size in (("m", 3), ("d", 2), ("mo", 2)):
                        window = _window(value, name, w[{"m": "minute", "d": "day", "mo": "month"}[name]][0], size)
                        window[-1] += tokens
                        new[name] = window
                if limits.concurrent:
                    new["c"] = self._in_flight(value, now, -1)
                return new

            await self._change(sid, end)

    async def give_back(self, scopes: list[Scope], admitted: float, now: float) -> None:
        """A request admitted at `admitted` against these scopes was refused after all: the
        request it counted in that minute is taken off again (where that minute is still the
        scope's current one) and its place in flight freed."""
        minute = windows(admitted)["minute"][0]
        for sid, _, limits in scopes:
            if limits == Limits():
                continue

            def back(value: dict, limits=limits) -> dict:
                new = dict(value)
                counted = value.get("m")
                if counted and counted[0] == minute:
                    new["m"] = [minute, max(0, counted[1] - 1), *counted[2:]]
                if limits.concurrent:
                    new["c"] = self._in_flight(value, now, -1)
                return new

            await self._change(sid, back)

    async def keep_alive(self, every_s: float) -> None:
        """Refresh this router's in-flight counts so long requests keep counting."""
        while True:
            await asyncio.sleep(every_s)
            for sid in list(self.busy):
                held: list[int] = []

                def touch(value: dict, held=held) -> dict | None:
                    n = value.get("c", {}).get(self.router, [0, 0])[0]
                    held.append(n)
                    return {**value, "c": self._in_flight(value, time.time(), 0)} if n else None

                await self._change(sid, touch)
                if not held or not held[-1]:
                    self.busy.discard(sid)
