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
        self._children: dict[tuple, object] = {}

    def _of(self, metric, *labels: str):
        """`metric`'s series of these `labels` (kept: `labels()` costs a lookup under a lock)."""
        key = (metric, *labels)
        if (child := self._children.get(key)) is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def ended(self, outcome: Outcome) -> None:
        """A request whose model was known ended: counted under the code it got; what an admitted
        one took and used is measured too."""
        name, served = outcome.model, outcome.served
        self._of(self._requests, name, served.pool, str(served.status)).inc()
        if not served.admitted:
            return
        self._of(self._latency, name, served.pool).observe(outcome.latency_s)
        if outcome.ttft_s is not None:
            self._of(self._ttft, name, served.pool).observe(outcome.ttft_s)
        usage = served.usage
        for kind, n in (("prompt", usage.prompt), ("cached", usage.cached or 0), ("completion", usage.completion)):
            if n:
                self._of(self._tokens, name, kind).inc(n)

    def rejected(self, reason: str) -> None:
        """A request refused before any engine (400, 413, 429), by its error code."""
        self._of(self._rejections, reason).inc()

    def picked(self, model: str, how: str, retry: bool) -> None:
        """A replica was picked for a request (`how`: the balancer's reason), maybe as a retry."""
        if retry:
            self._of(self._retries, model).inc()
        self._of(self._picks, model, how).inc()

    def in_flight(self, model: str, replica: str, delta: int) -> None:
        """A request to a replica started (+1) or ended (-1)."""
        self._of(self._in_flight, model, replica).inc(delta)
