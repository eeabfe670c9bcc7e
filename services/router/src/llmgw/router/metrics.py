"""The router's Prometheus series (on the admin port's /metrics), told what happened."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmgw.router.outcome import Outcome

__all__ = ["Metrics"]


class Metrics:
    """Requests by the code they got, tokens, latency, time to first token, replicas' load,
    retries, refusals and how replicas were picked."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "llmgw_router_requests", "Requests answered", ["model", "pool", "code"], registry=registry
        )
        self._tokens = Counter("llmgw_router_tokens", "Tokens", ["model", "kind"], registry=registry)
        self._ttft = Histogram(
            "llmgw_router_ttft_seconds",
            "Time to the first token of a stream",
            ["model", "pool"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self._latency = Histogram(
            "llmgw_router_latency_seconds",
            "Whole request latency",
            ["model", "pool"],
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self._in_flight = Gauge(
            "llmgw_router_in_flight", "Requests in flight per replica", ["model", "replica"], registry=registry
        )
        self._retries = Counter(
            "llmgw_router_retries", "Requests retried on another replica", ["model"], registry=registry
        )
        self._rejections = Counter(
            "llmgw_router_rejections", "Requests refused before any engine", ["reason"], registry=registry
        )
        self._picks = Counter("llmgw_router_picks", "How replicas were chosen", ["model", "how"], registry=registry)

    def ended(self, outcome: Outcome) -> None:
        """A request whose model was known ended: counted under the code it got; what an admitted
        one took and used is measured too."""
        name, served = outcome.model, outcome.served
        self._requests.labels(name, served.pool, str(served.status)).inc()
        if not served.admitted:
            return
        self._latency.labels(name, served.pool).observe(outcome.latency_s)
        if outcome.ttft_s is not None:
            self._ttft.labels(name, served.pool).observe(outcome.ttft_s)
        usage = served.usage
        for kind, n in (("prompt", usage.prompt), ("cached", usage.cached or 0), ("completion", usage.completion)):
            if n:
                self._tokens.labels(name, kind).inc(n)

    def rejected(self, reason: str) -> None:
        """A request refused before any engine (400, 413, 429), by its error code."""
        self._rejections.labels(reason).inc()

    def picked(self, model: str, how: str, retry: bool) -> None:
        """A replica was picked for a request (`how`: the balancer's reason), maybe as a retry."""
        if retry:
            self._retries.labels(model).inc()
        self._picks.labels(model, how).inc()

    def in_flight(self, model: str, replica: str, delta: int) -> None:
        """A request to a replica started (+1) or ended (-1)."""
        self._in_flight.labels(model, replica).inc(delta)
