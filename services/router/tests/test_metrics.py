"""The router's Prometheus series, counted in plain dicts and made into families when scraped:
what a scrape shows is what prometheus_client's own counters and histograms would show."""

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.router.metrics import Metrics
from llmgw.router.request.core import Usage
from llmgw.router.request.outcome import Outcome, Served, Ticket

TICKET = Ticket(request_id="r", key_id="k", project="p", model="m", started=0.0)
LABELS = {"model": "m", "pool": "priority 0"}


def _ended(metrics: Metrics, latency_s: float, **served) -> None:
    metrics.ended(Outcome(ticket=TICKET, served=Served(pool="priority 0", **served), latency_s=latency_s))


def test_requests_tokens_and_latency_as_a_scrape_shows_them():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    _ended(metrics, 0.1, status=200, usage=Usage(prompt=7, completion=3))  # on a bound: in its bucket
    _ended(metrics, 200.0, status=200, usage=Usage(prompt=1, completion=1))  # past every bound
    _ended(metrics, 0.01, status=429, admitted=False)  # counted by its code, nothing measured
    sample = registry.get_sample_value
    assert sample("llmgw_router_requests_total", {**LABELS, "code": "200"}) == 2
    assert sample("llmgw_router_requests_total", {**LABELS, "code": "429"}) == 1
    assert sample("llmgw_router_tokens_total", {"model": "m", "kind": "prompt"}) == 8
    assert sample("llmgw_router_tokens_total", {"model": "m", "kind": "cached"}) is None  # none cached
    assert sample("llmgw_router_latency_seconds_bucket", {**LABELS, "le": "0.05"}) == 0
    assert sample("llmgw_router_latency_seconds_bucket", {**LABELS, "le": "0.1"}) == 1
    assert sample("llmgw_router_latency_seconds_bucket", {**LABELS, "le": "120.0"}) == 1
    assert sample("llmgw_router_latency_seconds_bucket", {**LABELS, "le": "+Inf"}) == 2
    assert sample("llmgw_router_latency_seconds_count", LABELS) == 2
    assert sample("llmgw_router_latency_seconds_sum", LABELS) == 200.1
    assert sample("llmgw_router_ttft_seconds_count", LABELS) is None  # no stream


def test_load_picks_retries_and_refusals():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.in_flight("m", "r1", +1)
    metrics.in_flight("m", "r1", +1)
    metrics.in_flight("m", "r1", -1)
    metrics.picked("m", "affinity", retry=False)
    metrics.picked("m", "least-loaded", retry=True)
    metrics.rejected("rate_limit_exceeded")
    text = generate_latest(registry).decode()
    assert 'llmgw_router_in_flight{model="m",replica="r1"} 1.0' in text
    assert 'llmgw_router_picks_total{how="affinity",model="m"} 1.0' in text
    assert 'llmgw_router_retries_total{model="m"} 1.0' in text
    assert 'llmgw_router_rejections_total{reason="rate_limit_exceeded"} 1.0' in text
    assert "# TYPE llmgw_router_latency_seconds histogram" in text


def test_a_streams_time_per_output_token_and_each_tenants_tokens():
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    shop = Ticket(request_id="s", key_id="k", project="p", model="m", tenant="shop", started=0.0)
    served = Served(status=200, pool="priority 0", usage=Usage(prompt=5, completion=11), first_token=0.5)
    metrics.ended(Outcome(ticket=shop, served=served, latency_s=1.5))  # 10 tokens after the first in 1 s
    sample = registry.get_sample_value
    assert sample("llmgw_router_time_per_output_token_seconds_bucket", {**LABELS, "le": "0.08"}) == 0
    assert sample("llmgw_router_time_per_output_token_seconds_bucket", {**LABELS, "le": "0.1"}) == 1
    assert sample("llmgw_tenant_tokens_total", {"tenant": "shop", "model": "m", "kind": "completion"}) == 11
    assert sample("llmgw_tenant_tokens_total", {"tenant": "shop", "model": "m", "kind": "prompt"}) == 5
