"""The dashboard: the fleet at a glance (`glance`): replicas ready and wanted, host and card
memory, and the last hour's requests, failures, tokens a second and time to the first token,
as numbers and charts drawn on the server. It asks what the other pages ask (the scheduler's
statuses and nodes, the usage sums, the request log); a part whose service does not answer
says so and the rest is drawn."""

from __future__ import annotations

import time

from litestar import get
from litestar.response import Response
from markupsafe import Markup

from llmgw.proto import Empty, RequestLogAsk, UsageQuery, UsageRecord, router, scheduler
from llmgw.router.console.charts import Chart, Series, line_chart
from llmgw.router.console.glance import BUCKET_S, Traffic, fleet_of, traffic_of
from llmgw.router.console.web import Refused, View
from llmgw.router.request.core import bucket_start

__all__ = ["ROUTES", "SAMPLE"]

SAMPLE = 2000
"""The latest requests the time to the first token is reckoned from (four pages of the log at most)."""


async def _sample(view: View, since: float) -> list[UsageRecord]:
    """The latest requests since `since`, at most about `SAMPLE` of them."""
    got: list[UsageRecord] = []
    before = 0
    while len(got) < SAMPLE:
        page = await view.ask(router.REQUEST_LOG, RequestLogAsk(limit=500, before=before), optional=True)
        got += [r for r in page.requests if r.time >= since]
        if not page.next or (before and page.next >= before) or (page.requests and page.requests[-1].time < since):
            break
        before = page.next
    return got


def _charts(view: View, traffic: Traffic) -> list[tuple[str, Markup]]:
    """Requests and failures, tokens a second, and time to the first token, over the hour."""
    xs = traffic.starts

    def pairs(ys: list) -> list[tuple[float, float]]:
        return [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]

    drawn = [
        (
            "requests",
            [
                Series(view.t("dash.requests"), pairs(traffic.requests)),
                Series(view.t("dash.errors"), pairs(traffic.errors)),
            ],
            0,
        ),
        ("tokens", [Series(view.t("dash.tokens_per_s"), pairs(traffic.tokens_per_s))], 2),
        (
            "ttft",
            [
                Series("p50", pairs([t * 1000 if t is not None else None for t in traffic.ttft_p50])),
                Series("p95", pairs([t * 1000 if t is not None else None for t in traffic.ttft_p95])),
            ],
            0,
        ),
    ]
    out = []
    for name, series, digits in drawn:
        title = view.t(f"dash.chart_{name}")
        chart = Chart(
            id=f"dash-{name}",
            title=title,
            x_text=lambda x: time.strftime("%H:%M", time.gmtime(x)),
            y_text=lambda y, d=digits: view.num(y, d if not float(y).is_integer() else 0),
            empty=view.t("dash.chart_empty"),
        )
        out.append((title, line_chart(chart, series)))
    return out


@get("/dashboard")
async def dashboard_page(view: View) -> Response:
    """The fleet and the last hour's traffic."""
    now = time.time()
    missing: list[str] = []
    try:
        statuses = (await view.ask(scheduler.MODEL_STATUS, Empty(), optional=True)).models
        nodes = (await view.ask(scheduler.NODE_LIST, Empty(), optional=True)).nodes
        fleet = fleet_of(statuses, nodes)
    except Refused as exc:
        statuses, fleet = [], None
        missing.append(exc.message)
    since = now - 3600
    rows = (await view.console.accounts.sum_usage(UsageQuery(since=since, group_by="model", bucket_s=BUCKET_S))).rows
    try:
        records = await _sample(view, since)
    except Refused as exc:
        records = []
        missing.append(exc.message)
    traffic = traffic_of(rows, records, bucket_start(since, BUCKET_S), bucket_start(now, BUCKET_S))
    return view.render(
        "dashboard.html",
        active="dashboard",
        fleet=fleet,
        statuses=sorted(statuses, key=lambda s: s.model),
        traffic=traffic,
        charts=_charts(view, traffic),
        missing=missing,
    )


ROUTES = (dashboard_page,)
