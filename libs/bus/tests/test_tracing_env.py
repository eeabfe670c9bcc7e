"""Where spans go, read from OpenTelemetry's own environment: nothing unless asked, OTLP over
HTTP or gRPC where an endpoint is set, a list of exporters, and a refusal naming what is made."""

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from llmgw.bus import TracingError
from llmgw.bus._observe import span_exporters

OTEL = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in OTEL:
        monkeypatch.delenv(name, raising=False)


def kinds(monkeypatch, **env) -> list[type]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return [type(e) for e in span_exporters()]


def test_nothing_is_exported_unless_the_environment_asks(monkeypatch):
    assert kinds(monkeypatch) == []
    assert kinds(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://x:4318", OTEL_TRACES_EXPORTER="none") == []


def test_an_endpoint_exports_over_http_unless_grpc_is_asked(monkeypatch):
    assert kinds(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://x:4318") == [Http]
    assert kinds(monkeypatch, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc") == [Grpc]  # the traces' own first


def test_a_list_of_exporters_makes_each_once(monkeypatch):
    got = kinds(monkeypatch, OTEL_TRACES_EXPORTER="otlp, console,otlp", OTEL_EXPORTER_OTLP_ENDPOINT="http://x:4318")
    assert got == [Http, ConsoleSpanExporter]


def test_an_exporter_or_protocol_llmgw_does_not_make_is_refused_saying_what_it_makes(monkeypatch):
    with pytest.raises(TracingError, match="OTEL_TRACES_EXPORTER='zipkin': llmgw exports spans as otlp, console or"):
        kinds(monkeypatch, OTEL_TRACES_EXPORTER="zipkin")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    with pytest.raises(TracingError, match="'http/json': llmgw sends spans over http/protobuf or grpc"):
        kinds(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT="http://x:4318", OTEL_EXPORTER_OTLP_PROTOCOL="http/json")
