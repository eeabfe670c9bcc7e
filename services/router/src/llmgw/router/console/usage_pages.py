"""The usage page: requests and tokens per model, project or key over the last hour, day or week
(`Accounts.sum_usage`, the admin API's usage sums), as tables and as charts over time drawn on
the server (`charts`); the range and grouping are a GET form, so it works with JavaScript off."""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from litestar import get
from litestar.response import Response
from markupsafe import Markup

from llmgw.proto import Empty, UsageQuery, UsageRow
from llmgw.router.accounts.access import Principal
from llmgw.router.console.charts import Chart, Series, line_chart
from llmgw.router.console.web import View
from llmgw.router.request.core import bucket_start

__all__ = ["GROUPS", "RANGES", "ROUTES", "Range"]


class Range(NamedTuple):
    """A range the page offers: how far back, the charts' bucket, how a bucket's start is written."""

    span_s: int
    bucket_s: int
    tick: str
    """strftime of a tick on the time axis (UTC)."""


RANGES = {
    "hour": Range(3600, 300, "%H:%M"),
    "day": Range(86400, 3600, "%H:%M"),
    "week": Range(7 * 86400, 6 * 3600, "%m-%d %H:%M"),
}
"""The ranges, the first the default."""
GROUPS = ("model", "project", "key", "tenant")
"""What usage is grouped by, the first the default."""
_MOST_SERIES = 8
"""The charts draw the biggest groups, at most this many."""


def _series(rows: list[UsageRow], groups: list[str], starts: list[float], label: dict[str, str]) -> list[list[Series]]:
    """Requests and tokens of each of `groups` at every bucket start (none counted: 0)."""
    at = {(r.group, r.start): r for r in rows}
    requests, tokens = [], []
    for group in groups:
        got = [at.get((group, s)) for s in starts]
        requests.append(Series(label[group], [(s, r.requests if r else 0) for s, r in zip(starts, got, strict=True)]))
        totals = [(s, r.prompt_tokens + r.completion_tokens if r else 0) for s, r in zip(starts, got, strict=True)]
        tokens.append(Series(label[group], totals))
    return [requests, tokens]


@get("/usage")
async def usage_page(view: View, since: str = "hour", group_by: str = "model") -> Response:
    """Usage over the range `since` grouped by `group_by`: a table and charts over time."""
    who = view.principal
    assert who is not None
    if group_by in GROUPS and group_by not in _groups(who):
        group_by = "key"  # its own keys' usage, or its tenants'

    form = {"since": since, "group_by": group_by}
    if since not in RANGES or group_by not in GROUPS:
        error = view.t("usage.err.choice", since=since, group_by=group_by)
        return _render(view, form, status=400, error=error)
    accounts, now, chosen = view.console.accounts, time.time(), RANGES[since]
    start = now - chosen.span_s
    total, bucketed = await asyncio.gather(
        accounts.sum_usage(UsageQuery(since=start, group_by=group_by)),
        accounts.sum_usage(UsageQuery(since=start, group_by=group_by, bucket_s=chosen.bucket_s)),
    )
    names = (await accounts.list_keys(Empty())).keys if group_by == "key" or not who.admin else {}
    total.rows = who.seen_usage(group_by, total.rows, names)
    bucketed.rows = who.seen_usage(group_by, bucketed.rows, names)
    label = {r.group: r.group for r in total.rows}
    if group_by == "key":
        label = {g: view.t("usage.key_label", name=names[g].name, id=g) if g in names else g for g in label}
    first, last = bucket_start(start, chosen.bucket_s), bucket_start(now, chosen.bucket_s)
    starts = [float(s) for s in range(int(first), int(last) + 1, chosen.bucket_s)]
    shown = [r.group for r in total.rows[:_MOST_SERIES]]
    words = {"range": view.t(f"usage.range.{since}"), "by": view.t(f"usage.by.{group_by}")}
    charts = []
    for what, series in zip(("requests", "tokens"), _series(bucketed.rows, shown, starts, label), strict=True):
        title = view.t(f"usage.chart_{what}", **words)
        chart = Chart(
            id=f"usage-{what}",
            title=title,
            x_text=lambda x: time.strftime(chosen.tick, time.gmtime(x)),
            y_text=lambda y: view.num(y, 0 if float(y).is_integer() else 2),
            empty=view.t("usage.chart_empty"),
        )
        charts.append((title, line_chart(chart, series)))
    return _render(view, form, rows=total.rows, label=label, charts=charts, more=len(total.rows) - len(shown))


def _render(view: View, form: dict[str, str], status: int = 200, **data: object) -> Response:
    """The page with the range form (`form`: what was asked) and what there is of `data`."""
    shown = {"error": "", "rows": [], "label": {}, "charts": list[tuple[str, Markup]](), "more": 0, **data}
    groups = _groups(view.principal)
    return view.render("usage.html", status=status, active="usage", form=form, ranges=RANGES, groups=groups, **shown)


def _groups(who: Principal | None) -> tuple[str, ...]:
    """What `who` may group usage by on this page (`Principal.usage_groups`)."""
    return tuple(g for g in GROUPS if who is not None and g in who.usage_groups())


ROUTES = (usage_page,)
