"""Admission against the limits of a request's key and project (`Quota`), on the shared counters
(`counting.py`). Tokens are held at admission (the most a request may use) and settled at its
end (what it used); a request's end waits up to `end_wait_s` for a change to go with.

Far from its limits a router does not ask KV for each request: each write takes a lease of the
scope's headroom (`limits.grant`: an eighth of what is left under each limit, half where no
other router counts there), which the others count as used until it is `lease_s` old. Requests
that fit it are admitted at once, kept as one change a minute (`Mine.keep`) and written in the
background (within `flush_s`, or once half of it is spent and no write is on its way), each
write renewing it. Near a limit leases shrink to nothing and each request is judged on KV; a
router that stops leaves its lease counted for at most `lease_s`."""

from __future__ import annotations

import asyncio

from llmgw.proto import Limits
from llmgw.router.accounts import counters
from llmgw.router.accounts.counters import Op, counts_tokens, holds
from llmgw.router.accounts.counting import Counting
from llmgw.router.accounts.limits import Verdict, judge

__all__ = ["Quota", "Scope"]

Scope = tuple[str, str, Limits]
"""(KV key such as "key.ab12...", how a person names it such as "key 'ci'", its limits)."""


class Quota(Counting):
    """Admits requests against the limits of their key and project, and counts what they used."""

    # -- a lease ----------------------------------------------------------------------------------
    def _from_lease(self, sid: str, name: str, limits: Limits, op: Op, reserve: int) -> Verdict | None:
        """Admit `op` from this router's lease of the scope, where what is left of it holds it:
        counted here, written in the background. None: the counters must judge it."""
        mine = self.mine.get(sid)
        if mine is None or asyncio.get_running_loop().time() >= mine.until or not mine.fits(limits, op):
            return None
        verdict = judge(name, limits, mine.counts(), op.at, reserve)
        if not verdict.ok:
            return None
        self._done(sid, op, sent=False)
        self._spent_soon(sid)
        return verdict

    def _spent_soon(self, sid: str) -> None:
        """Write what was counted here in `sid` within `flush_s`, or now where half a part of its
        lease is spent and no write is on its way to renew it (one queued behind it would lease
        only what came meanwhile); what the lease cannot hold meanwhile is judged on KV."""
        if sid not in self.writing and self.mine[sid].half_spent():
            self._flush(sid)
        else:
            self._due(sid, self.flush_s, self._flush)

    # -- a request's way --------------------------------------------------------------------------
    async def admit(self, scopes: list[Scope], now: float, reserve: int = 0) -> Verdict:
        """Count this request, which may use up to `reserve` tokens, against every scope with
        limits (its tokens held until it ends), or say which limit refuses it (nothing is counted
        then). The headers are those of every scope, the last winning; its budget, the most used."""
        headers: dict[str, str] = {}
        budget = 0.0
        admitted: list[Scope] = []
        for scope in scopes:
            sid, name, limits = scope
            if limits == Limits():
                continue
            self.limits[sid] = limits
            op = Op(at=now, requests=1, n=int(holds(limits)), held=reserve if counts_tokens(limits) else 0)
            verdict = self._from_lease(sid, name, limits, op, reserve) or await self._change(
                sid, op, lambda counts, name=name, limits=limits: judge(name, limits, counts, now, reserve)
            )
            if not verdict.ok:
                await self.give_back(admitted, now, now, reserve)
                return verdict
            admitted.append(scope)
            headers.update(verdict.headers)
            budget = max(budget, verdict.budget)
        return Verdict(ok=True, headers=headers, budget=budget)

    def finish_leased(self, scopes: list[Scope], tokens: int, now: float, reserve: int = 0) -> list[Scope]:
        """`finish` at once for the scopes this router holds a lease of (counted here, written
        within `flush_s`: no task, no wait); the others that count requests in flight returned."""
        rest = []
        for sid, name, limits in scopes:
            if holds(limits) and (mine := self.mine.get(sid)) is not None and mine.lease is not None:
                self._done(sid, counters.ended(limits, tokens, now, reserve), sent=False)
                self._spent_soon(sid)
            elif holds(limits):
                rest.append((sid, name, limits))
        return rest

    async def finish(self, scopes: list[Scope], tokens: int, now: float, reserve: int = 0) -> None:
        """A request admitted against these scopes, holding `reserve` tokens, ended having used
        `tokens`: one fewer in flight, its hold let go, its tokens added to the minute, the day
        and the month. Written with the scope's next change, or within `end_wait_s`."""
        for sid, _, limits in self.finish_leased(scopes, tokens, now, reserve):
            await self._change(sid, counters.ended(limits, tokens, now, reserve), wait_s=self.end_wait_s)

    async def give_back(self, scopes: list[Scope], admitted: float, now: float, reserve: int = 0) -> None:
        """A request admitted at `admitted` against these scopes was refused after all: the
        request it counted in that minute is taken off again (where that minute is still the
        scope's current one) and its place in flight and its hold freed."""
        for sid, _, limits in scopes:
            if limits == Limits():
                continue
            held = reserve if counts_tokens(limits) else 0
            await self._change(sid, Op(at=now, when=admitted, requests=-1, n=-int(holds(limits)), held=-held))
