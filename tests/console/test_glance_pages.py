"""The dashboard, the request log, the playground and the serve chooser with JavaScript off
against the real catalog, scheduler and router (no engine: what a page says with no traffic, and
bad input refused naming the field); the numbers the dashboard reckons, as a table."""

from urllib.parse import quote

import pytest

from llmgw.bus import call
from llmgw.proto import Model, ModelPut, NodeInfo, UsageRecord, UsageRow, catalog
from llmgw.proto.scheduler import ModelStatus
from llmgw.router.console.glance import BUCKET_S, fleet_of, percentile, traffic_of
from tests.fleets import SOURCE


@pytest.mark.parametrize(
    ("values", "p", "want"),
    [([], 50, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([float(i) for i in range(1, 101)], 95, 95.0)],
)
def test_percentile_is_the_nearest_rank(values, p, want):
    assert percentile(values, p) == want


def test_the_fleet_and_the_hour_are_summed_into_buckets_with_ttft_from_the_sample():
    statuses = [
        ModelStatus(model="a", state="running", ready=2, wanted=2),
        ModelStatus(model="b", state="parked", wanted=1),
    ]
    nodes = [NodeInfo(node="n", hostname="n", cpus=4, memory_total_mb=1000, memory_available_mb=400)]
    fleet = fleet_of(statuses, nodes)
    assert (fleet.ready, fleet.wanted, fleet.running, fleet.models) == (2, 3, 1, 2)
    assert (fleet.host_used_mb, fleet.host_total_mb, fleet.cards) == (600, 1000, 0)
    rows = [
        UsageRow(group="a", start=0.0, requests=3, errors=1, completion_tokens=600),
        UsageRow(group="b", start=0.0, requests=1, completion_tokens=300),
        UsageRow(group="a", start=float(BUCKET_S), requests=2),
    ]
    records = [
        UsageRecord(request_id=str(i), time=10.0 + i, key="k", project="p", model="a", ttft_s=t)
        for i, t in enumerate([0.1, 0.2, None, 0.4])
    ]
    traffic = traffic_of(rows, records, 0.0, float(2 * BUCKET_S))
    assert traffic.starts == [0.0, 300.0, 600.0] and traffic.requests == [4, 2, 0] and traffic.errors == [1, 0, 0]
    assert traffic.tokens_per_s == [3.0, 0.0, 0.0] and (traffic.total_requests, traffic.total_errors) == (6, 1)
    assert traffic.ttft_p50 == [0.2, None, None] and traffic.ttft_p95 == [0.4, None, None]
    assert traffic.ttft_all == (0.2, 0.4) and traffic.sampled == 3


async def test_the_dashboard_draws_with_no_traffic_and_says_so(stack):
    browser = await stack.signed_in()
    page = await browser.page("/console/dashboard")
    assert page.status_code == 200 and 'id="tile-requests"><span class="big">0<' in page.text
    ttft = page.text[page.text.index('id="dash-ttft"') :]
    assert "Nothing to draw: no request in the last hour." in ttft[: ttft.index("</svg>")]  # zero requests: drawn
    assert 'aria-current="page">Dashboard<' in page.text


async def test_the_request_log_refuses_a_key_filter_it_cannot_take_and_says_none_match(stack):
    browser = await stack.signed_in()
    bad = await browser.page("/console/requests?key=not-a-key")
    assert bad.status_code == 400 and "a key is its 16-hex-digit id" in bad.text
    empty = await browser.page("/console/requests?errors=1")
    assert empty.status_code == 200 and 'id="requests-none"' in empty.text


async def test_the_playground_refuses_what_it_cannot_send_naming_the_field(stack):
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="t"))
    browser = await stack.signed_in()
    for _ in range(50):  # the router's copy of the catalog follows a KV watch
        page = await browser.page("/console/playground")
        if 'value="tiny"' in page.text:
            break
    form = {"model": "tiny", "prompt": "hi", "max_tokens": "10", "temperature": "0.5"}
    for change, said in [
        ({"prompt": "  "}, "Write a message to send."),
        ({"temperature": "3"}, "Temperature &#39;3&#39; is not allowed"),
        ({"max_tokens": "99999"}, "Longest answer (tokens): &#39;99999&#39; is not allowed"),
        ({"model": "other"}, "&#39;other&#39; is not a model your key may use"),
    ]:
        refused = await browser.post("/console/playground", {**form, **change})
        assert refused.status_code == 400 and said in refused.text, (change, refused.text[-1500:])
    streamed = await browser.post("/console/playground/stream", {**form, "model": "other"})
    assert streamed.status_code == 400 and "is not a model your key may use" in streamed.json()["error"]["message"]


async def test_serve_from_the_navigation_lists_the_files_the_mirror_holds(stack):
    browser = await stack.signed_in()
    page = await browser.page("/console/serve")
    assert page.status_code == 200 and SOURCE.rsplit("/", 1)[-1] in page.text
    assert f'href="/console/serve?source={quote(SOURCE, safe="/")}"' in page.text
