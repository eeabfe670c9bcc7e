"""Limits, pure: the windows a count falls in, whether a request may go, and the headers that
tell the client where it stands. The counters themselves are in KV (`quota.py`)."""

from __future__ import annotations

import calendar
import time

import msgspec

from llmgw.proto import Limits

__all__ = ["Counts", "Verdict", "judge", "windows"]


class Counts(msgspec.Struct, kw_only=True):
    """What one scope (a key or a project) has used in the windows that hold now."""

    minute_requests: int = 0
    minute_tokens: int = 0
    day_tokens: int = 0
    month_tokens: int = 0
    concurrent: int = 0
    """Requests in flight, this one not counted."""


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


def judge(scope: str, limits: Limits, counts: Counts, now: float) -> Verdict:
    """Whether one more request fits `limits` given `counts` (`scope` names it: "key 'ci'").
    The headers are OpenAI's `x-ratelimit-*` for the minute's requests and tokens."""
    w = windows(now)
    headers = {}
    if limits.requests_per_minute:
        headers["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(max(0, limits.requests_per_minute - counts.minute_requests - 1))
        headers["x-ratelimit-reset-requests"] = f"{w['minute'][1]:.0f}s"
    if limits.tokens_per_minute:
        headers["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, limits.tokens_per_minute - counts.minute_tokens))
        headers["x-ratelimit-reset-tokens"] = f"{w['minute'][1]:.0f}s"
    checks = [
        ("requests_per_minute", limits.requests_per_minute, counts.minute_requests, w["minute"][1], True),
        ("tokens_per_minute", limits.tokens_per_minute, counts.minute_tokens, w["minute"][1], True),
        ("concurrent", limits.concurrent, counts.concurrent, 1.0, True),
        ("tokens_per_day", limits.tokens_per_day, counts.day_tokens, w["day"][1], False),
        ("tokens_per_month", limits.tokens_per_month, counts.month_tokens, w["month"][1], False),
    ]
    for name, limit, used, reset, retry in checks:
        if limit is not None and used >= limit:
            return Verdict(
                ok=False,
                limit=f"{scope}: {name} {limit} reached ({used} used)",
                reset_s=reset,
                retry=retry,
                headers=headers,
            )
    return Verdict(ok=True, headers=headers)
