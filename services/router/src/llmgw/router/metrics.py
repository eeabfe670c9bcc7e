"""The router's Prometheus series (on the admin port's /metrics), told what happened.

Counted in plain dicts on the request path and turned into Prometheus families only when
scraped (`_Collector`): prometheus_client's own counters take a lock and a label lookup on every
increment, ten of them a request, a few percent of the router's requests a second."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmgw.bus import family
from llmgw.router.request.outcome import Outcome

__all__ = ["LATENCY_BUCKETS", "TPOT_BUCKETS", "TTFT_BUCKETS", "Metrics"]

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Upper bounds (seconds) of the time-to-first-token histogram's buckets."""
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
"""Upper bounds (seconds) of the whole-request latency histogram's buckets."""
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)
"""Upper bounds (seconds) of the time-per-output-token histogram's buckets (a card's 200 tokens
a second to a slow CPU's 1)."""


class _Histogram:
    """One series of a histogram: the count in each bucket (not cumulative; the last is past
    every bound) and the sum of what was observed."""

    __slots__ = ("counts", "sum")

    def __init__(self, bounds: int) -> None:
        self.counts, self.sum = [0] * (bounds + 1), 0.0


class Metrics:
    """Requests by the code they got, tokens, latency, time to first token, replicas' load,
    retries, refusals and how replicas were picked."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        """(model, pool, code) -> requests answered."""
        self.tokens: dict[tuple[str, str], int] = {}
        """(model, kind: prompt, cached or completion) -> tokens."""
        self.ttft: dict[tuple[str, str], _Histogram] = {}
        """(model, pool) -> time to the first token of a stream."""
        self.latency: dict[tuple[str, str], _Histogram] = {}
        """(model, pool) -> whole request latency."""
        self.tpot: dict[tuple[str, str], _Histogram] = {}
        """(model, pool) -> time per output token of a stream, after its first."""
        self.tenant_tokens: dict[tuple[str, str, str], int] = {}
        """(tenant, model, kind) -> tokens."""
        self.budgets: dict[str, float] = {}
        """Key id -> the largest share of a token budget (its own, its project's) used, as its
        latest request here found it."""
        self.in_flight_now: dict[tuple[str, str], int] = {}
        """(model, replica) -> requests in flight."""
        self.retries: dict[str, int] = {}
        """model -> requests retried on another replica."""
        self.rejections: dict[str, int] = {}
        """reason -> requests refused before any engine."""
        self.picks: dict[tuple[str, str], int] = {}
        """(model, how) -> replicas chosen so."""
        self.guard: dict[tuple[str, str, str], int] = {}
        """(policy, category, action) -> what guardrail checks found."""
        registry.register(_Collector(self))

    def guarded(self, policy: str, seen: list[tuple[str, str]]) -> None:
        """What a policy's checks found in one request or answer: (category, action) each."""
        for category, action in seen:
            self.guard[policy, category, action] = self.guard.get((policy, category, action), 0) + 1

    def ended(self, outcome: Outcome) -> None:
        """A request whose model was known ended: counted under the code it got; what an admitted
        one took and used is measured too."""
        name, served = outcome.model, outcome.served
        key = (name, served.pool, str(served.status))
        self.requests[key] = self.requests.get(key, 0) + 1
        if not served.admitted:
            return
        _observe(self.latency, (name, served.pool), LATENCY_BUCKETS, outcome.latency_s)
        usage, tokens, tenants, tenant = served.usage, self.tokens, self.tenant_tokens, outcome.ticket.tenant
        if outcome.ttft_s is not None:
            _observe(self.ttft, (name, served.pool), TTFT_BUCKETS, outcome.ttft_s)
            if usage.completion > 1:
                tpot = (outcome.latency_s - outcome.ttft_s) / (usage.completion - 1)
                _observe(self.tpot, (name, served.pool), TPOT_BUCKETS, tpot)
        for kind, n in (("prompt", usage.prompt), ("cached", usage.cached or 0), ("completion", usage.completion)):
            if n:
                tokens[name, kind] = tokens.get((name, kind), 0) + n
                tenants[tenant, name, kind] = tenants.get((tenant, name, kind), 0) + n

    def rejected(self, reason: str) -> None:
        """A request refused before any engine (400, 413, 429), by its error code."""
        self.rejections[reason] = self.rejections.get(reason, 0) + 1

    def picked(self, model: str, how: str, retry: bool) -> None:
        """A replica was picked for a request (`how`: the balancer's reason), maybe as a retry."""
        if retry:
            self.retries[model] = self.retries.get(model, 0) + 1
        self.picks[model, how] = self.picks.get((model, how), 0) + 1

    def in_flight(self, model: str, replica: str, delta: int) -> None:
        """A request to a replica started (+1) or ended (-1)."""
        self.in_flight_now[model, replica] = self.in_flight_now.get((model, replica), 0) + delta


def _observe(series: dict[tuple[str, str], _Histogram], key: tuple[str, str], bounds: tuple, value: float) -> None:
    """`value` counted in its bucket (the first whose bound it does not pass) of `key`'s series."""
    h = series.get(key)
    if h is None:
        h = series[key] = _Histogram(len(bounds))
    h.counts[bisect.bisect_left(bounds, value)] += 1
    h.sum += value


class _Collector(Collector):
    """The counts as Prometheus families, made when scraped (from a copy: a scrape on another
    thread never sees a dict change under it)."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield family(CounterMetricFamily, "llmgw_router_requests", "Requests answered", m.requests, "model pool code")
        yield family(CounterMetricFamily, "llmgw_router_tokens", "Tokens", m.tokens, "model kind")
        yield family(
            CounterMetricFamily, "llmgw_router_guard_findings", "Guardrail findings", m.guard, "policy category action"
        )
        yield _histogram("llmgw_router_ttft_seconds", "Time to the first token of a stream", m.ttft, TTFT_BUCKETS)
        yield _histogram("llmgw_router_latency_seconds", "Whole request latency", m.latency, LATENCY_BUCKETS)
        yield _histogram(
            "llmgw_router_time_per_output_token_seconds",
            "Time per output token of a stream, after its first",
            m.tpot,
            TPOT_BUCKETS,
        )
        yield family(
            CounterMetricFamily, "llmgw_tenant_tokens", "Tokens by tenant", m.tenant_tokens, "tenant model kind"
        )
        budgets = {(k,): v for k, v in list(m.budgets.items())}
        yield family(
            GaugeMetricFamily,
            "llmgw_budget_used_ratio",
            "Share of a key's daily or monthly token budget (or its project's) used, the most of them",
            budgets,
            "key",
        )
        in_flight = m.in_flight_now
        yield family(
            GaugeMetricFamily, "llmgw_router_in_flight", "Requests in flight per replica", in_flight, "model replica"
        )
        retried = {(k,): v for k, v in list(m.retries.items())}
        yield family(
            CounterMetricFamily, "llmgw_router_retries", "Requests retried on another replica", retried, "model"
        )
        refused = {(k,): v for k, v in list(m.rejections.items())}
        yield family(
            CounterMetricFamily, "llmgw_router_rejections", "Requests refused before any engine", refused, "reason"
        )
        yield family(CounterMetricFamily, "llmgw_router_picks", "How replicas were chosen", m.picks, "model how")


def _histogram(name: str, doc: str, series: dict[tuple[str, str], _Histogram], bounds: tuple) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["model", "pool"])
    for key, h in list(series.items()):
        counts, total, cumulative = list(h.counts), h.sum, []
        seen = 0
        for bound, count in zip((*(floatToGoString(b) for b in bounds), "+Inf"), counts, strict=True):
            seen += count
            cumulative.append((bound, seen))
        family.add_metric(list(key), cumulative, sum_value=total)
    return family
