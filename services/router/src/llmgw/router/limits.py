"""Limits, pure: the windows a count falls in, whether a request may go, and the headers that
tell the client where it stands. The counters themselves are in KV (`quota.py`)."""

from __future__ import annotations

import calendar
import time

import msgspec

from llmgw.proto import Limits

__all__ = ["Counts", "Verdict", "judge", "standing", "windows"]


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


def windows(now: float) -> dict[str, tuple[str, float]]:
    """Window name -> (its id, seconds until it resets): the UTC minute, day and month."""
    t = time.gmtime(now)
    minute_end = (int(now) // 60 + 1) * 60
    day_end = (int(now) // 86400 + 1) * 86400
    month_days = calendar.monthrange(t.tm_year, t.tm_mon)[1]
    month_end = calendar.timegm((t.tm_year, t.tm_mon, month_days, 0, 0, 0)) + 86400
    return {
        "minute": (time.strftime("%Y%m%d%H%M", t), minute_end - now),
        "day": (time.strftime("%Y%m%d", t), day_end - now),
        "month": (time.strftime("%Y%m", t), month_end - now),
    }


_COUNTED = (  # each limit, the count held against it, whether it counts tokens, its window
    ("requests_per_minute", "minute_requests", False, "minute"),
    ("tokens_per_minute", "minute_tokens", True, "minute"),
    ("concurrent", "concurrent", False, None),
    ("tokens_per_day", "day_tokens", True, "day"),
    ("tokens_per_month", "month_tokens", True, "month"),
)


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
    return Verdict(ok=True, headers=headers)


def _how_much(used: int, held: int, reserve: int) -> str:
    """What a refusal says was spent: used, held by requests in flight, and what this one may use."""
    said = f"{used} used"
    if held:
        said += f", {held} held by requests in flight"
    if reserve:
        said += f"; this request may use up to {reserve}"
    return said
