"""An OTLP trace receiver for tests, built on the `opentelemetry-proto` messages: ours, not the
OpenTelemetry Collector (which no registry llmgw installs from has). It takes
`ExportTraceServiceRequest`s over OTLP/HTTP (POST /v1/traces, protobuf) and OTLP/gRPC
(TraceService/Export) and keeps every span with its service's name."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from llmgw.bus import free_port

__all__ = ["OtlpReceiver", "Received"]


class Received(NamedTuple):
    """One span as it arrived."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]
    protocol: str
    """"http" or "grpc"."""


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1: `http_url` for OTLP/HTTP, `grpc_url` for OTLP/gRPC."""

    def __init__(self, keep: bool = True) -> None:
        """`keep`: keep the spans (else only count them: a benchmark's millions)."""
        self.spans: list[Received] = []
        self.keep, self.count = keep, 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body), "http")
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver.take(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        port = free_port()
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.grpc)
        self.grpc.add_insecure_port(f"127.0.0.1:{port}")
        self.grpc.start()
        self.grpc_url = f"http://127.0.0.1:{port}"

    def take(self, request, protocol: str) -> None:
        """Keep every span of an export (or count them)."""
        if not self.keep:
            self.count += sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
            return
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    got.append(
                        Received(
                            service=str(resource.get("service.name", "")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            protocol=protocol,
                        )
                    )
        with self._lock:
            self.spans.extend(got)

    def wait_for(self, found, what: str, within: float = 60.0):
        """What `found(spans)` returns once it is truthy; AssertionError naming `what` past `within`."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self._lock:
                seen = list(self.spans)
            if got := found(seen):
                return got
            time.sleep(0.2)
        names = sorted({(s.service, s.name) for s in seen})[:60]
        raise AssertionError(f"never received {what}; received {names}")

    def stop(self) -> None:
        self.http.shutdown()
        self.grpc.stop(0)
