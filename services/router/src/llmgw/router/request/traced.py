"""A span for each request the router answers, where this process exports spans (`llmgw.bus.tracing`;
none is made otherwise): opened once the model is known, carried to the engine as a
`traceparent` header, and ended with how the request went: the replica, the status, the tokens,
the time to the first token and what the engine says its prompt and answer took."""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from llmgw.bus import inject
from llmgw.router.request.outcome import Outcome, Ticket

__all__ = ["MOST_OPEN", "Traces"]

MOST_OPEN = 100_000
"""Spans open at once at most (past it, the oldest is let go: a request whose end never came)."""


class Traces:
    """The open spans of requests, by request id."""

    def __init__(self) -> None:
        self.tracer = trace.get_tracer("llmgw.router")
        self.open: dict[str, Span] = {}

    def begin(self, ticket: Ticket, path: str) -> dict[str, str] | None:
        """Open the span of a request; the headers that carry it to the engine (None where this
        request's trace is not sampled)."""
        if len(self.open) >= MOST_OPEN:
            self.open.pop(next(iter(self.open)))
        span = self.tracer.start_span(
            f"POST {path}",
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "url.path": path,
                "gen_ai.request.model": ticket.model,
                "llmgw.tenant": ticket.tenant,
                "llmgw.project": ticket.project,
                "llmgw.request_id": ticket.request_id,
            },
        )
        if not span.is_recording():
            return None
        self.open[ticket.request_id] = span
        return inject({}, trace.set_span_in_context(span))

    def end(self, outcome: Outcome) -> None:
        """End the span of a request with how it went."""
        span = self.open.pop(outcome.ticket.request_id, None)
        if span is None:
            return
        served, usage = outcome.served, outcome.served.usage
        attributes: dict[str, str | int | float] = {
            "http.response.status_code": served.status,
            "gen_ai.response.model": outcome.model,
            "gen_ai.usage.input_tokens": usage.prompt,
            "gen_ai.usage.output_tokens": usage.completion,
            "llmgw.replica": served.replica,
            "llmgw.admitted": served.admitted,
        }
        if usage.cached is not None:
            attributes["llmgw.cached_tokens"] = usage.cached
        if served.first_token is not None:
            attributes["llmgw.time_to_first_token_s"] = round(served.first_token - outcome.ticket.started, 6)
        if usage.prompt_ms is not None:
            attributes["llmgw.engine.prompt_ms"] = usage.prompt_ms
        if usage.generation_ms is not None:
            attributes["llmgw.engine.generation_ms"] = usage.generation_ms
        span.set_attributes(attributes)
        if served.status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"answered {served.status}"))
        span.end(end_time=time.time_ns())
