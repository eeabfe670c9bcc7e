"""structlog JSON logs carrying service, node and trace ids; OpenTelemetry tracing across NATS."""

from __future__ import annotations

import logging
import os
import sys

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["extract", "get_logger", "inject", "setup_logging", "setup_tracing"]

_propagator = TraceContextTextMapPropagator()


def _add_trace_ids(_logger, _name, event: dict) -> dict:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def setup_logging(service: str, node: str, level: str = "info") -> None:
    """JSON lines on stderr, each with service, node and (inside a span) trace ids."""
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine health check is noise
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service, node=node)


def get_logger(name: str = "llmgw") -> structlog.stdlib.BoundLogger:
    """A structlog logger."""
    return structlog.get_logger(name)


def setup_tracing(service: str, version: str) -> None:
    """A tracer provider for this process; spans print to stderr when OTEL_TRACES_EXPORTER=console."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"llmgw-{service}", "service.version": version})
    )
    if os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Headers carrying the current span (traceparent) to the next hop."""
    headers = dict(headers or {})
    _propagator.inject(headers)
    return headers


def extract(headers: dict[str, str] | None) -> otel_context.Context:
    """The span context a message's headers carry."""
    return _propagator.extract(headers or {})
