"""Traces leave every process over OTLP as the standard environment says, on a real `llmgw up`
(its five services in their own processes, a real llama-server) and a real `llmgw ctl`, into an
OTLP receiver of ours (`tests/otlp.py`): the services send over OTLP/HTTP, ctl over OTLP/gRPC.
A chat request is one span with the engine's timings; an operator's change is one trace from
ctl through the catalog and the scheduler to the agent that starts the engine."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.otlp import OtlpReceiver
from tests.test_up import DEMO, QUESTION, Up


@pytest.fixture(scope="module")
def receiver():
    running = OtlpReceiver()
    yield running
    running.stop()


def _otlp(url: str, protocol: str) -> dict[str, str]:
    return {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # spans leave within a fifth of a second, not five
    }


@pytest.fixture(scope="module")
def up(tmp_path_factory, receiver):
    running = Up(tmp_path_factory.mktemp("traced"), env=_otlp(receiver.http_url, "http/protobuf"))
    running.wait_ready()
    yield running
    if running.proc.poll() is None:
        running.stop()


def test_a_chat_request_is_one_span_with_the_replica_tokens_and_the_engines_timings(up, receiver):
    headers = {"authorization": f"Bearer {up.key}", "x-request-id": "traced-chat-1"}
    body = {"model": DEMO, "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    answered = httpx.post(f"{up.base_url}/chat/completions", headers=headers, json=body, timeout=60)
    assert answered.status_code == 200, answered.text

    def chat(spans):
        return [s for s in spans if s.attributes.get("llmgw.request_id") == "traced-chat-1"]

    (span,) = receiver.wait_for(chat, "the chat request's span")
    assert (span.service, span.name, span.protocol) == ("llmgw-router", "POST /v1/chat/completions", "http")
    a = span.attributes
    assert a["gen_ai.request.model"] == DEMO and a["http.response.status_code"] == 200
    assert a["llmgw.replica"] == answered.headers["x-llmgw-replica"]
    assert a["gen_ai.usage.output_tokens"] == answered.json()["usage"]["completion_tokens"] > 0
    assert a["llmgw.engine.prompt_ms"] > 0 and a["llmgw.engine.generation_ms"] > 0


def test_an_operators_change_is_one_trace_from_ctl_to_the_engine_started(up, receiver):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--data-dir", str(up.home), "model", "scale", DEMO, "2"]
    done = subprocess.run(ctl, env=_otlp(receiver.grpc_url, "grpc"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    def one_trace(spans):
        roots = [s for s in spans if s.name == "llmgw ctl model scale" and s.service == "llmgw-ctl"]
        if not roots:
            return None
        trace = [s for s in spans if s.trace_id == roots[0].trace_id]
        started = [s for s in trace if s.name.startswith("start engine ")]
        return trace if started else None

    trace = receiver.wait_for(one_trace, "the change's trace down to an engine started", within=120)
    by_id = {s.span_id: s for s in trace}
    engine = next(s for s in trace if s.name.startswith("start engine "))
    chain, span = [], engine
    while span is not None:  # from the engine's start up to ctl, parent by parent
        chain.append((span.service, span.name))
        span = by_id.get(span.parent_id)
    services = [service for service, _ in chain]
    assert services[0] == "llmgw-agent" and services[-1] == "llmgw-ctl", chain
    assert {"llmgw-scheduler", "llmgw-catalog"} <= set(services), chain
    assert any(name.startswith("place replica ") for _, name in chain), chain
    ctl_spans = [s for s in trace if s.service == "llmgw-ctl"]
    assert {s.protocol for s in ctl_spans} == {"grpc"} and {s.protocol for s in trace if s.service != "llmgw-ctl"} == {
        "http"
    }


def test_an_export_llmgw_does_not_make_is_refused_before_anything_starts(up):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--data-dir", str(up.home), "models"]
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    }
    done = subprocess.run(ctl, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': llmgw sends spans over http/protobuf or grpc" in done.stderr
