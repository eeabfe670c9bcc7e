"""Limits, pure: the windows a count falls in, whether a request may go, and the headers that
tell the client where it stands. The counters themselves are in KV (`counting.py`)."""

from __future__ import annotations

import calendar
import functools
import time

import msgspec

from llmgw.proto import Limits

__all__ = [
    "ALONE_SHARE",
    "LEASE_SHARE",
    "Counts",
    "Lease",
    "Verdict",
    "grant",
    "judge",
    "standing",
    "window_ids",
    "windows",
]


class Counts(msgspec.Struct, kw_only=True):
    """What one scope (a key or a project) has used in the windows that hold now."""

    minute_requests: int = 0
    minute_tokens: int = 0
    day_tokens: int = 0
    month_tokens: int = 0
    concurrent: int = 0
    """Requests in flight, this one not counted."""
    reserved: int = 0
    """Tokens held by the requests in flight (the most each may use), not yet settled."""


class Verdict(msgspec.Struct, kw_only=True):
    """May the request go; if not, which limit, when it resets and whether to retry."""

    ok: bool
    limit: str = ""
    reset_s: float = 0.0
    retry: bool = True
    """False for a spent budget: retrying before the reset cannot help."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    budget: float = 0.0
    """Of an admitted request: the largest share of a daily or monthly token budget used (0: none set)."""


@functools.lru_cache(maxsize=8)
def _ends(second: int) -> tuple[tuple[str, int], tuple[str, int], tuple[str, int]]:
    """The UTC minute, day and month that hold `second`: each its id and the second it ends."""
    t = time.gmtime(second)
    month_days = calendar.monthrange(t.tm_year, t.tm_mon)[1]
    return (
        (time.strftime("%Y%m%d%H%M", t), (second // 60 + 1) * 60),
        (time.strftime("%Y%m%d", t), (second // 86400 + 1) * 86400),
        (time.strftime("%Y%m", t), calendar.timegm((t.tm_year, t.tm_mon, month_days, 0, 0, 0)) + 86400),
    )


def window_ids(t: float) -> tuple[str, str, str]:
    """The ids of the UTC minute, day and month that hold `t`."""
    (minute, _), (day, _), (month, _) = _ends(int(t))
    return minute, day, month


def windows(now: float) -> dict[str, tuple[str, float]]:
    """Window name -> (its id, seconds until it resets): the UTC minute, day and month."""
    (minute, minute_end), (day, day_end), (month, month_end) = _ends(int(now))
    return {"minute": (minute, minute_end - now), "day": (day, day_end - now), "month": (month, month_end - now)}


_COUNTED = (  # each limit, the count held against it, whether it counts tokens, its window
    ("requests_per_minute", "minute_requests", False, "minute"),
    ("tokens_per_minute", "minute_tokens", True, "minute"),
    ("concurrent", "concurrent", False, None),
    ("tokens_per_day", "day_tokens", True, "day"),
    ("tokens_per_month", "month_tokens", True, "month"),
)


_BUDGETS = (("tokens_per_day", "day_tokens"), ("tokens_per_month", "month_tokens"))


def standing(limits: Limits, counts: Counts) -> list[tuple[str, int, int]]:
    """Each limit set, in the order `judge` checks them: (its name, the limit, what is used
    against it now)."""
    return [(n, getattr(limits, n), getattr(counts, c)) for n, c, _, _ in _COUNTED if getattr(limits, n) is not None]


def judge(scope: str, limits: Limits, counts: Counts, now: float, reserve: int = 0) -> Verdict:
    """Whether one more request, which may use up to `reserve` tokens, fits `limits` given
    `counts` (`scope` names it: "key 'ci'"): a token limit takes it only where what was used, what
    the requests in flight hold and what it may use all fit (at least one token must), so requests
    at once never pass it together. A hold larger than a limit itself counts as the whole limit
    (a request without max_tokens may hold a model's longest answer: it waits for a quiet window
    rather than never passing). The headers are OpenAI's `x-ratelimit-*` for the minute's
    requests and tokens."""
    w = windows(now)
    headers = {}
    if limits.requests_per_minute:
        headers["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(max(0, limits.requests_per_minute - counts.minute_requests - 1))
        headers["x-ratelimit-reset-requests"] = f"{w['minute'][1]:.0f}s"
    if limits.tokens_per_minute:
        headers["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        remaining = limits.tokens_per_minute - counts.minute_tokens - counts.reserved
        headers["x-ratelimit-remaining-tokens"] = str(max(0, remaining))
        headers["x-ratelimit-reset-tokens"] = f"{w['minute'][1]:.0f}s"
    for name, count, tokens, window in _COUNTED:
        limit, used, reset = getattr(limits, name), getattr(counts, count), w[window][1] if window else 1.0
        held, asked = (counts.reserved, max(min(reserve, limit or reserve), 1)) if tokens else (0, 1)
        if limit is not None and used + held + asked > limit:
            budget = name in ("tokens_per_day", "tokens_per_month")
            return Verdict(
                ok=False,
                limit=f"{scope}: {name} {limit} reached ({_how_much(used, held, reserve if tokens else 0)})",
                reset_s=reset,
                retry=not budget or (held > 0 and used + asked <= limit),  # a spent budget: not before it resets
                headers=headers,
            )
    budget = max((getattr(counts, c) / getattr(limits, n) for n, c in _BUDGETS if getattr(limits, n)), default=0.0)
    return Verdict(ok=True, headers=headers, budget=budget)


class Lease(msgspec.Struct, frozen=True, array_like=True):
    """Headroom one router may spend in a scope without asking the counters: requests in
    `minute`, tokens (held by requests in flight or used since its last write) and requests in
    flight beyond those it wrote. The other routers count it as used."""

    minute: str = ""
    requests: int = 0
    tokens: int = 0
    concurrent: int = 0


LEASE_SHARE = 8
"""A router leases at most this fraction (1/8) of what is left under a limit while other routers
count in the scope: near it, leases shrink to nothing and every request is judged on the
counters themselves."""
ALONE_SHARE = 2
"""A router alone in a scope (no other router holds requests or a lease there) leases up to half
of what is left: a key with a small concurrency limit (7 in flight) is admitted without a write
per request, and a router that comes finds the other half, and the first's next write (within
`lease_s / 2`) leases an eighth again."""


def grant(limits: Limits, counts: Counts, want: Lease, now: float, alone: bool = False) -> Lease | None:
    """The lease a router takes, wanting `want`, where the scope stands at `counts` (all but this
    lease counted): for each limit set, the smaller of what it wants and a share of what is left
    (`ALONE_SHARE` where the router is `alone` in the scope, else `LEASE_SHARE`). None where a
    limit set would lease nothing (no request could be admitted from it: each is judged on the
    counters)."""
    share = ALONE_SHARE if alone else LEASE_SHARE
    tokens_left = [
        limit - used - counts.reserved
        for limit, used in (
            (limits.tokens_per_minute, counts.minute_tokens),
            (limits.tokens_per_day, counts.day_tokens),
            (limits.tokens_per_month, counts.month_tokens),
        )
        if limit is not None
    ]
    lease = Lease(
        minute=windows(now)["minute"][0],
        requests=_share(limits.requests_per_minute, counts.minute_requests, want.requests, share),
        tokens=min(want.tokens, max(0, min(tokens_left) // share)) if tokens_left else 0,
        concurrent=_share(limits.concurrent, counts.concurrent, want.concurrent, share),
    )
    useless = (
        (limits.requests_per_minute is not None and not lease.requests)
        or (tokens_left and not lease.tokens)
        or (limits.concurrent is not None and not lease.concurrent)
        or not (lease.requests or lease.tokens or lease.concurrent)
    )
    return None if useless else lease


def _share(limit: int | None, used: int, want: int, share: int) -> int:
    """What a lease takes of what is left under one limit, a `share` part at most (nothing where
    the limit is not set)."""
    return 0 if limit is None else min(want, max(0, (limit - used) // share))


def _how_much(used: int, held: int, reserve: int) -> str:
    """What a refusal says was spent: used, held by requests in flight, and what this one may use."""
    said = f"{used} used"
    if held:
        said += f", {held} held by requests in flight"
    if reserve:
        said += f"; this request may use up to {reserve}"
    return said
