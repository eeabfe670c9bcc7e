"""structlog JSON logs carrying service, node and trace ids; OpenTelemetry tracing across NATS,
exported over OTLP (HTTP or gRPC) as the standard OTEL_* environment says."""

from __future__ import annotations

import logging
import os
import sys

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["TracingError", "extract", "get_logger", "inject", "setup_logging", "setup_tracing", "tracing"]

_propagator = TraceContextTextMapPropagator()
_exporting = False
_provider: TracerProvider | None = None
PROTOCOLS = ("http/protobuf", "grpc")
"""The OTLP transports spans leave by (OTEL_EXPORTER_OTLP_PROTOCOL)."""


class TracingError(ValueError):
    """The OTEL_* environment asks for an export llmgw does not make."""


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


def _env(*names: str) -> str:
    """The first of the environment variables `names` that is set, stripped; "" for none."""
    return next((v.strip() for n in names if (v := os.environ.get(n, "")).strip()), "")


def span_exporters() -> list[SpanExporter]:
    """Where spans go, as OpenTelemetry's environment says: OTEL_TRACES_EXPORTER (a list of otlp,
    console, none; otlp where an OTLP endpoint is set, else none) and, for otlp, the protocol
    (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: http/protobuf, the default, or grpc). The OTLP exporter
    reads its endpoint, headers, certificate, compression and timeout from the same environment."""
    endpoint = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    names = [n.strip() for n in _env("OTEL_TRACES_EXPORTER").lower().split(",") if n.strip()]
    if "none" in names:
        return []
    return [_exporter(name) for name in dict.fromkeys(names or (["otlp"] if endpoint else []))]


def _exporter(name: str) -> SpanExporter:
    """One exporter by its OTEL_TRACES_EXPORTER name; TracingError for one llmgw does not make."""
    if name == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    if name != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER={name!r}: llmgw exports spans as otlp, console or none")
    protocol = _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOLS[0]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: llmgw sends spans over {' or '.join(PROTOCOLS)}")


def setup_tracing(service: str, version: str, node: str = "") -> TracerProvider:
    """This process's tracer provider: spans exported where the environment says (`span_exporters`),
    sampled as OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG say (the SDK's default: every
    trace, and what a caller sampled); with no exporter, none recorded at all."""
    global _exporting, _provider
    if _provider is not None:  # once a process (several services, or ctl's verbs, in one)
        return _provider
    exporters = span_exporters()
    attributes = {"service.name": f"llmgw-{service}", "service.version": version}
    if node:
        attributes["service.instance.id"] = node
    provider = TracerProvider(resource=Resource.create(attributes), sampler=None if exporters else ALWAYS_OFF)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _exporting, _provider = bool(exporters), provider
    return provider


def tracing() -> bool:
    """Whether this process exports spans: where it does not, hot paths (the router's requests)
    make none."""
    return _exporting


def inject(headers: dict[str, str] | None = None, context: otel_context.Context | None = None) -> dict[str, str]:
    """Headers carrying the current span (or `context`'s) as a traceparent to the next hop."""
    headers = dict(headers or {})
    _propagator.inject(headers, context)
    return headers


def extract(headers: dict[str, str] | None) -> otel_context.Context:
    """The span context a message's headers carry."""
    return _propagator.extract(headers or {})
