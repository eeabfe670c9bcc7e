"""Limit counters in JetStream KV, shared by every router: each change is compare-and-set on
the entry's revision, so two routers counting at once never lose a count and a limit is
never looser than one router alone would keep it.

Entries (bucket `llmgw_limits`, values expire after 32 days):
  <scope>.m.<UTC minute>  {"requests": n, "tokens": n}
  <scope>.d.<UTC day>     {"tokens": n}
  <scope>.mo.<UTC month>  {"tokens": n}
  <scope>.c               {router: [in flight, unix time]}  (a router not heard of for
                          `stale_s` no longer counts: a crashed router leaks nothing)
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
"""(KV id such as "key.ab12...", how a person names it such as "key 'ci'", its limits)."""


class Quota:
    """Admits requests against the limits of their key and project, and counts what they used."""

    def __init__(self, kv: KeyValue, router: str, stale_s: float = 60.0) -> None:
        self.kv, self.router, self.stale_s = kv, router, stale_s
        self.in_flight: dict[str, int] = {}
        """Scope -> this router's requests in flight (refreshed in KV by `keep_alive`)."""

    async def _get(self, key: str) -> tuple[dict, int | None]:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return {}, None
        return (msgspec.json.decode(entry.value) if entry.value else {}), entry.revision

    async def _change(self, key: str, change: Callable[[dict], dict | None]) -> dict:
        """Read, change, write back only if nobody wrote in between; else again. `change`
        returning None writes nothing."""
        while True:
            value, revision = await self._get(key)
            new = change(dict(value))
            if new is None:
                return value
            try:
                if revision is None:
                    await self.kv.create(key, msgspec.json.encode(new))
                else:
                    await self.kv.update(key, msgspec.json.encode(new), last=revision)
                return new
            except KeyWrongLastSequenceError:
                continue

    async def admit(self, scopes: list[Scope], now: float) -> Verdict:
        """Count this request against every scope with limits, or say which limit refuses it
        (nothing is counted then). The headers are those of the tightest scope."""
        headers: dict[str, str] = {}
        admitted: list[Scope] = []
        w = windows(now)
        for scope in scopes:
            sid, name, limits = scope
            if limits == Limits():
                continue
            counts = Counts()
            if limits.tokens_per_day:
                counts.day_tokens = (await self._get(f"{sid}.d.{w['day'][0]}"))[0].get("tokens", 0)
            if limits.tokens_per_month:
                counts.month_tokens = (await self._get(f"{sid}.mo.{w['month'][0]}"))[0].get("tokens", 0)
            if limits.concurrent:
                counts.concurrent = self._concurrent((await self._get(f"{sid}.c"))[0], now)
            verdict: Verdict | None = None

            def count(value: dict, limits=limits, counts=counts, name=name) -> dict | None:
                nonlocal verdict
                counts.minute_requests, counts.minute_tokens = value.get("requests", 0), value.get("tokens", 0)
                verdict = judge(name, limits, counts, now)
                if not verdict.ok:
                    return None
                return {**value, "requests": counts.minute_requests + 1}

            await self._change(f"{sid}.m.{w['minute'][0]}", count)
            if not verdict.ok:
                for earlier in admitted:
                    await self.release([earlier], now)
                return verdict
            if limits.concurrent:
                await self._enter(sid, now)
            admitted.append(scope)
            headers.update(verdict.headers)
        return Verdict(ok=True, headers=headers)

    def _concurrent(self, value: dict, now: float) -> int:
        return sum(n for router, (n, seen) in value.items() if now - seen < self.stale_s or router == self.router)

    async def _enter(self, sid: str, now: float, delta: int = 1) -> None:
        self.in_flight[sid] = max(0, self.in_flight.get(sid, 0) + delta)
        mine = self.in_flight[sid]

        def put(value: dict) -> dict:
            value[self.router] = [mine, now]
            return {r: v for r, v in value.items() if v[0] > 0 and now - v[1] < self.stale_s or r == self.router}

        await self._change(f"{sid}.c", put)

    async def release(self, scopes: list[Scope], now: float) -> None:
        """A request admitted against these scopes ended: one fewer in flight."""
        for sid, _, limits in scopes:
            if limits.concurrent:
                await self._enter(sid, now, -1)

    async def spend(self, scopes: list[Scope], tokens: int, now: float) -> None:
        """Add a finished request's tokens to its scopes' minute, day and month."""
        if tokens <= 0:
            return
        w = windows(now)
        for sid, _, limits in scopes:
            wanted = [("m", w["minute"][0], limits.tokens_per_minute), ("d", w["day"][0], limits.tokens_per_day),
                      ("mo", w["month"][0], limits.tokens_per_month)]
            for kind, window, limit in wanted:
                if limit:
                    await self._change(f"{sid}.{kind}.{window}",
                                       lambda v: {**v, "tokens": v.get("tokens", 0) + tokens})

    async def keep_alive(self, every_s: float) -> None:
        """Refresh this router's in-flight counts so long requests keep counting."""
        while True:
            await asyncio.sleep(every_s)
            for sid, n in list(self.in_flight.items()):
                if n > 0:
                    await self._enter(sid, time.time(), 0)
