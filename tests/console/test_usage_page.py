"""The usage page with JavaScript off, against a real router and its usage stream: requests'
usage published as the router does shows in the table per model, project or key, and as points
of the charts in their time buckets; the range is a GET form; names are shown as text."""

import asyncio
import re
import time
from collections import Counter

from llmgw.proto import Empty, UsageRecord
from llmgw.router.request.core import bucket_start


async def _publish(stack, records: list[UsageRecord]) -> None:
    for r in records:
        stack.router.accounts.ended([], 0, 0, r.time, r)  # what the router does when a request ends


async def _page_with(browser, path: str, needle: str):
    for _ in range(100):
        page = await browser.page(path)
        if needle in page.text:
            return page
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never showed {needle!r}: {page.text[:2000]}")


def _points(html: str, chart: str) -> set[tuple[str, str, str]]:
    svg = html[html.index(f'<svg class="chart" id="usage-{chart}"') :]
    svg = svg[: svg.index("</svg>")]
    return set(re.findall(r'data-series="([^"]*)" data-x="([^"]*)" data-y="([^"]*)"', svg))


def _expected(records: list[UsageRecord], since: float, bucket_s: int, label) -> set[tuple[str, str, str]]:
    """The chart points the records make: requests per group and bucket."""
    counted = Counter((label(r), bucket_start(r.time, bucket_s)) for r in records if r.time >= since)
    return {(group, f"{start:.15g}", str(n)) for (group, start), n in counted.items()}


async def test_usage_per_model_project_and_key_in_tables_and_chart_points(stack):
    now = time.time()
    keys = (await stack.router.accounts.list_keys(Empty())).keys
    [kid] = [i for i, k in keys.items() if k.name == "user"]
    one = {"key": kid, "project": "team", "prompt_tokens": 10, "completion_tokens": 5}
    records = [
        UsageRecord(request_id="a", time=now - 1, model="tiny", **one),
        UsageRecord(request_id="b", time=now - 2, model="tiny", status=500, **one),
        UsageRecord(request_id="c", time=now - 1800, model="other", **one),
        UsageRecord(request_id="d", time=now - 2 * 86400, model="old", **one),
    ]
    await _publish(stack, records)
    browser = await stack.signed_in()
    page = await _page_with(browser, "/console/usage?since=hour&group_by=model", 'data-group="other"')
    assert page.status_code == 200 and "data-live" not in page.text  # a report: it reads the usage stream, on demand
    start = page.text.index('data-group="tiny"')
    tiny = page.text[start : page.text.index("</tr>", start)]
    assert re.findall(r'<td class="num">([^<]*)</td>', tiny) == ["2", "1", "20", "0", "10", "30"]
    assert 'data-group="old"' not in page.text  # two days ago: not in the last hour
    requests, tokens = _points(page.text, "requests"), _points(page.text, "tokens")
    assert _expected(records, now - 3600, 300, lambda r: r.model) <= requests
    assert ("other", f"{bucket_start(now - 1800, 300):.15g}", "15") in tokens
    assert ("tiny", f"{bucket_start(now - 1800, 300):.15g}", "0") in requests  # a bucket without it
    assert '<title id="usage-requests-title">Requests over the last hour, per Model</title>' in page.text

    week = await browser.page("/console/usage?since=week&group_by=model")
    assert 'data-group="old"' in week.text
    assert _expected(records, now - 7 * 86400, 21600, lambda r: r.model) <= _points(week.text, "requests")
    by_project = await browser.page("/console/usage?since=day&group_by=project")
    assert re.search(r'data-group="team">\s*<th scope="row">team</th>\s*<td class="num">3</td>', by_project.text)
    by_key = await browser.page("/console/usage?since=day&group_by=key")
    assert f"user ({kid})" in by_key.text
    assert _expected(records, now - 86400, 3600, lambda r: f"user ({kid})") <= _points(by_key.text, "requests")


async def test_an_empty_range_says_so_and_a_bad_choice_is_refused_on_the_page(stack):
    browser = await stack.signed_in()
    empty = await browser.page("/console/usage")
    assert empty.status_code == 200 and "No request was made in this range." in empty.text
    assert empty.text.count("Nothing to draw: no request in this range.") == 2
    assert '<option value="hour" selected>' in empty.text and '<option value="model" selected>' in empty.text
    for query in ("since=year", "group_by=<script>", "since=hour&group_by=replica"):
        bad = await browser.page(f"/console/usage?{query}")
        assert bad.status_code == 400 and "is not a choice here" in bad.text and "<script>" not in bad.text


async def test_a_model_name_with_markup_is_shown_as_text_in_the_table_and_the_charts(stack):
    marked = '<script>alert("x")</script>'
    await _publish(stack, [UsageRecord(request_id="m", time=time.time(), key="k", project="p", model=marked)])
    browser = await stack.signed_in()
    page = await _page_with(browser, "/console/usage", "&lt;script&gt;")
    assert marked not in page.text and "<script>alert" not in page.text
    assert '<th scope="row">&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;</th>' in page.text  # the table
    assert '">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</text>' in page.text  # a chart's legend
    assert len(_points(page.text, "requests")) == 1 + (3600 // 300)  # every bucket of the hour, zeros too
