"""The limit counters' KV entry, pure: what one scope's entry says, how a router's changes go
into it, and the lease a router takes there. The writing (compare-and-set, batches, NATS away,
writes in doubt) is `counting.py`'s.

One entry per scope (bucket `llmgw_limits`):
  <scope>  {"m": [UTC minute, requests, tokens], "d": [UTC day, tokens],
            "mo": [UTC month, tokens], "c": {router: [in flight, unix time]},
            "h": {router: tokens held by its requests in flight},
            "l": {router: [UTC minute, requests, tokens, in flight, unix time]},
            "s": {router: [the stamp of its last write, unix time]}}
A window whose id is not the current one counts as empty; an in-flight entry not written for
`stale_s`, and a lease (`l`) older than `lease_s`, no longer count. A write's stamp says, to the
router whose answer to it never came, whether it landed (`Mine.settle`); kept for `STAMP_S`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from llmgw.proto import Limits
from llmgw.router.accounts.limits import Counts, Lease, grant, window_ids, windows

__all__ = [
    "STAMP_S",
    "Doubt",
    "Mine",
    "Op",
    "Snapshot",
    "Terms",
    "Written",
    "counted",
    "counts_tokens",
    "counts_with",
    "ended",
    "holds",
    "others",
    "want",
    "written",
]

STAMP_S = 86400.0
"""How long the others' writes keep a router's stamp: one cut off from NATS for up to this long
after a write whose answer never came still finds whether that write landed."""
_WINDOWS = (("m", "minute", 3), ("d", "day", 2), ("mo", "month", 2))
"""Each window: its field, its name in `windows`, the length of its list (in `window_ids`'s order)."""


class Op(msgspec.Struct, frozen=True, kw_only=True):
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


class Terms(msgspec.Struct, frozen=True):
    """Whose entry is whose: the router reading or writing, and how long another router's
    in-flight entry (`stale_s`) and lease (`lease_s`) count after it was written."""

    router: str
    stale_s: float
    lease_s: float


class Doubt(msgspec.Struct, frozen=True):
    """A write whose answer never came (it timed out, or failed otherwise on its way): it may
    have landed or not."""

    snapshot: Snapshot
    """What it wrote of this router's own (its stamp, the lease it took)."""
    carried: int
    """It carried the first `carried` unsent changes."""


class Mine(msgspec.Struct):
    """What one router holds in one scope, what it counted there that KV has not heard, and the
    lease it admits from."""

    n: int = 0
    held: int = 0
    unsent: list[Op] = msgspec.field(default_factory=list)
    unsent_requests: int = 0
    unsent_tokens: int = 0
    sent_n: int = 0
    """In flight, as this router's entry in KV last said (a lease's requests in flight are beyond)."""
    sent_held: int = 0
    """Tokens held, as its entry in KV last said (a lease's tokens count from there)."""
    lease: Lease | None = None
    until: float = 0.0
    """Loop time after which the lease is no longer spent (half its life: clocks differ)."""
    base: Counts | None = None
    """The scope's counts as last written, this router's own left out (the fast path's headers)."""
    biggest: int = 0
    """The most tokens a request of this scope held (what a lease of tokens must fit a few of)."""
    last_at: float = 0.0
    """The time of the last change counted here (what a background write is dated)."""
    sealed: int = 0
    """How many of `unsent` the last write taken carries: left as they are until it is back (a
    write that failed leaves them so until the next one is back)."""
    stamp: int = 0
    """The stamp of this router's latest write of the scope (in the entry's `s`)."""
    doubts: list[Doubt] = msgspec.field(default_factory=list)
    """Writes whose answer never came since the last one answered: each carried at least what
    the one before it did, and compare-and-set lets at most one of them land."""

    def keep(self, op: Op) -> None:
        """Count `op` as unsent: folded into the last unsent change where that one is not on its
        way, neither takes requests back and both count in the same minute (KV's windows count
        the two as one), so that a write carries a change or two however many came since the last."""
        last = self.unsent[-1] if len(self.unsent) > self.sealed else None
        if last is not None and min(last.requests, op.requests) >= 0 and _minute(last) == _minute(op):
            self.unsent[-1] = Op(
                at=max(last.at, op.at),
                when=last.counted_at,
                requests=last.requests + op.requests,
                tokens=last.tokens + op.tokens,
                n=last.n + op.n,
                held=last.held + op.held,
            )
        else:  # a request given back counts against a window never below zero: on its own
            self.unsent.append(op)
        self.unsent_requests += op.requests
        self.unsent_tokens += op.tokens

    def seal(self) -> int:
        """A write takes the changes unsent now: how many (none of them changes until `drop_sent`)."""
        self.sealed = len(self.unsent)
        return self.sealed

    def drop_sent(self, count: int) -> None:
        """The first `count` unsent changes (a write's `seal`) are in KV now (and no write in
        doubt can land any more: this one did, or one written after it)."""
        sent, self.unsent = self.unsent[:count], self.unsent[count:]
        self.doubts = []
        self.sealed = max(0, self.sealed - count)
        self.unsent_requests -= sum(op.requests for op in sent)
        self.unsent_tokens -= sum(op.tokens for op in sent)

    def sent(self, snapshot: Snapshot) -> bool:
        """A write took this router's own as `snapshot` says: what it carried is in KV, and its
        lease is the one taken. Whether KV now has all it counted."""
        self.drop_sent(snapshot.unsent)
        written = snapshot.written
        self.sent_n, self.sent_held, self.base = written.n, written.held, written.base
        self.lease, self.until = written.lease, snapshot.until
        return not self.unsent and (self.n, self.held) == (written.n, written.held)

    def unanswered(self, snapshot: Snapshot, ops: Sequence[Op]) -> None:
        """The answer to a write (`snapshot`) never came: besides the sealed changes it carried
        `ops`, kept after those, sealed too, until an entry read says whether it landed
        (`settle`) or a later write is answered (`drop_sent`)."""
        at = self.sealed
        self.unsent[at:at] = ops
        self.sealed = at + len(ops)
        self.unsent_requests += sum(op.requests for op in ops)
        self.unsent_tokens += sum(op.tokens for op in ops)
        self.doubts.append(Doubt(snapshot, self.sealed))

    def settle(self, value: dict, router: str) -> None:
        """The entry read as `value`: the write in doubt whose stamp it bears, if any, landed
        (what it carried is in KV, and the lease it took is this router's); the others never will."""
        stamp = value.get("s", {}).get(router, [None])[0]
        for doubt in self.doubts:
            if doubt.snapshot.stamp == stamp:
                self.sent(msgspec.structs.replace(doubt.snapshot, unsent=doubt.carried))
                return

    def renew(self, lease: Lease | None) -> None:
        """A write takes `lease` anew: what was spent of the old one while it was on its way
        is never more than either allows."""
        spent, old = self.spent(), self.lease
        if old is not None:
            self.lease = lease and Lease(
                minute=old.minute,
                requests=min(old.requests, spent.requests + lease.requests),
                tokens=min(old.tokens, spent.tokens + lease.tokens),
                concurrent=min(old.concurrent, spent.concurrent + lease.concurrent),
            )

    def spent(self) -> Lease:
        """What was admitted here since the last write, against what a lease gives."""
        return Lease(
            requests=self.unsent_requests,
            tokens=self.held - self.sent_held + self.unsent_tokens,
            concurrent=self.n - self.sent_n,
        )

    def fits(self, limits: Limits, op: Op) -> bool:
        """Whether what is left of the lease (taken in the minute of `op`) holds `op`."""
        lease = self.lease
        if lease is None or self.base is None or lease.minute != windows(op.at)["minute"][0]:
            return False
        spent = self.spent()
        return not (
            (limits.requests_per_minute is not None and spent.requests + op.requests > lease.requests)
            or (op.held and spent.tokens + op.held > lease.tokens)
            or (limits.concurrent is not None and spent.concurrent + op.n > lease.concurrent)
        )

    def half_spent(self) -> bool:
        """Whether half of a part of the lease is spent (time to write and renew it)."""
        spent, lease = self.spent(), self.lease
        return lease is not None and any(
            given and 2 * used > given
            for used, given in (
                (spent.requests, lease.requests),
                (spent.tokens, lease.tokens),
                (spent.concurrent, lease.concurrent),
            )
        )

    def counts(self) -> Counts:
        """The scope's counts as this router sees them between writes: those last written, what it
        counted since and what it holds (what a request admitted from the lease is told)."""
        base = self.base or Counts()
        return msgspec.structs.replace(
            base,
            minute_requests=base.minute_requests + self.unsent_requests,
            minute_tokens=base.minute_tokens + self.unsent_tokens,
            day_tokens=base.day_tokens + self.unsent_tokens,
            month_tokens=base.month_tokens + self.unsent_tokens,
            concurrent=base.concurrent + self.n,
            reserved=base.reserved + self.held,
        )


def _minute(op: Op) -> int:
    """The UTC minute `op` counts in (two changes in the same minute are in the same day and
    month too)."""
    return int(op.counted_at) // 60


def counts_tokens(limits: Limits) -> bool:
    """Whether these limits count tokens (requests in flight hold what they may use)."""
    return bool(limits.tokens_per_minute or limits.tokens_per_day or limits.tokens_per_month)


def holds(limits: Limits) -> bool:
    """Whether requests in flight are counted for these limits (a concurrency or a token limit)."""
    return bool(limits.concurrent) or counts_tokens(limits)


def ended(limits: Limits, tokens: int, now: float, reserve: int) -> Op:
    """The change a request's end makes, holding `reserve` tokens and having used `tokens`."""
    return Op(at=now, tokens=tokens, n=-1, held=-(reserve if counts_tokens(limits) else 0))


def counted(value: dict, ops: list[Op], now: float) -> dict:
    """The windows of `value` as they stand `now` (an old window empty; a newer one, written by a
    router whose clock is ahead, kept), with `ops` counted in where they fall in them."""
    current = windows(now)
    out = dict(value)
    where = [window_ids(op.counted_at) for op in ops]  # (minute, day, month): worked out once each
    for k, (field, name, size) in enumerate(_WINDOWS):
        got = value.get(field)
        window = list(got) if got and got[0] >= current[name][0] else [current[name][0]] + [0] * (size - 1)
        for op, ids in zip(ops, where, strict=True):
            if ids[k] == window[0]:
                if field == "m":
                    window[1] = max(0, window[1] + op.requests)
                window[-1] += op.tokens
        out[field] = window
    return out


def others(value: dict, terms: Terms, now: float, ops: Sequence[Op] = (), leased: bool = True) -> Counts:
    """The scope's counts in `value` with `ops` counted in the windows, and what the routers but
    `terms.router` hold in flight (and, `leased`, have leased)."""
    router, stale_s, lease_s = terms.router, terms.stale_s, terms.lease_s
    windowed = counted(value, list(ops), now)
    counts = Counts(
        minute_requests=windowed["m"][1],
        minute_tokens=windowed["m"][2],
        day_tokens=windowed["d"][1],
        month_tokens=windowed["mo"][1],
    )
    held = value.get("h", {})
    for other, (n, seen) in value.get("c", {}).items():
        if other != router and now - seen < stale_s:
            counts.concurrent += n
            counts.reserved += held.get(other, 0)
    if leased:
        minute = windows(now)["minute"][0]
        for other, (at_minute, requests, tokens, concurrent, seen) in value.get("l", {}).items():
            if other != router and now - seen < lease_s:
                counts.minute_requests += requests if at_minute == minute else 0
                counts.reserved += tokens
                counts.concurrent += concurrent
    return counts


def counts_with(base: Counts, n: int, held: int) -> Counts:
    """`base` with a router's `n` requests in flight holding `held` tokens."""
    return msgspec.structs.replace(base, concurrent=base.concurrent + n, reserved=base.reserved + held)


def want(mine: Mine, ops: Sequence[Op]) -> Lease | None:
    """The lease a router asks for in a scope: a few times what it admitted since its last write
    (None where it admitted nothing: an idle router leases nothing)."""
    requests = mine.unsent_requests + sum(op.requests for op in ops if op.requests > 0)
    if requests <= 0:
        return None
    spent = mine.spent()
    biggest = max([mine.biggest, *(op.held for op in ops)])
    return Lease(
        requests=max(16, 4 * requests),
        tokens=max(16 * biggest, 4 * (spent.tokens + sum(op.held for op in ops))),
        concurrent=max(8, 2 * (mine.n + sum(op.n for op in ops))),
    )


class Written(msgspec.Struct, frozen=True):
    """A scope's entry as one router writes it, and what of that router's own it says."""

    value: dict
    n: int
    held: int
    lease: Lease | None
    base: Counts
    """The scope's counts in it, the router's own left out."""


def written(value: dict, terms: Terms, mine: Mine, ops: Sequence[Op], now: float, limits: Limits | None) -> Written:
    """`value` with the router's unsent counts and `ops` in, its in-flight entry its own, its
    lease taken anew (where `limits` are known and it admitted something since its last write)
    and its stamp `mine.stamp`."""
    router, stale_s, lease_s = terms.router, terms.stale_s, terms.lease_s
    new = counted(value, [*mine.unsent, *ops], now)
    n = max(0, mine.n + sum(op.n for op in ops))
    held = max(0, mine.held + sum(op.held for op in ops))
    kept = {r: v for r, v in value.get("c", {}).items() if r != router and now - v[1] < stale_s}
    new["c"] = {**kept, router: [n, now]} if n else kept
    holding = {r: h for r, h in value.get("h", {}).items() if r in kept}
    new["h"] = {**holding, router: held} if held else holding
    leases = {r: v for r, v in value.get("l", {}).items() if r != router and now - v[-1] < lease_s}
    base = others(new, terms, now)
    asked = want(mine, ops) if limits is not None else None
    alone = not (kept or leases)  # no other router holds requests or a lease here
    lease = grant(limits, counts_with(base, n, held), asked, now, alone) if limits is not None and asked else None
    if lease is not None:
        leases[router] = [lease.minute, lease.requests, lease.tokens, lease.concurrent, now]
    new["l"] = leases
    stamps = {r: v for r, v in value.get("s", {}).items() if r != router and now - v[1] < STAMP_S}
    new["s"] = {**stamps, router: [mine.stamp, now]}
    return Written(new, n, held, lease, base)


class Snapshot(msgspec.Struct, frozen=True):
    """What one write sends of a router's own: the first `unsent` changes counted there, and
    the entry as written (its in-flight count, held tokens and lease)."""

    unsent: int
    written: Written
    until: float
    """Loop time until which the lease may be spent (from before the write: the others count it
    from the time in the entry)."""
    stamp: int
