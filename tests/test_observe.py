"""llmgw seen from outside, on a real `llmgw up` (its five services in their own processes, a
real llama-server) and a real `llmgw ctl`:

- traces leave every process over OTLP as the standard environment says, into an OTLP receiver
  of ours (`tests/otlp.py`): the services send over OTLP/HTTP, ctl over OTLP/gRPC. A chat
  request is one span with the engine's timings; an operator's change is one trace from ctl
  through the catalog and the scheduler to the agent that starts the engine;
- a real Prometheus (Debian's) finds every service from the file `llmgw up` writes and scrapes
  them all; the shipped alert rules pass `promtool`, and every series the rules and the Grafana
  dashboards ask for is one llmgw exports;
- a real Alertmanager hears a shipped rule fire when a replica's engine is killed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.otlp import OtlpReceiver
from tests.prometheus import RULES, Alertmanager, Prometheus, Webhook, installed
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


DASHBOARDS = sorted((Path(__file__).parent.parent / "deploy" / "grafana").glob("*.json"))
_SERIES = re.compile(r"\b(llmgw_[a-z0-9_]+|up)\b(?!\s*\()")  # a name, not a function's


def _exprs() -> dict[str, list[str]]:
    """Every PromQL expression the shipped dashboards and rules ask, by where it is."""
    found: dict[str, list[str]] = {}
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        asked = [t["expr"] for p in board["panels"] for t in p["targets"]]
        asked += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
        found[path.name] = asked
    rules = yaml.safe_load(RULES.read_text())
    found[RULES.name] = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return found


def _scraped(sd: Path) -> set[str]:
    """The name of every series the services in llmgw's file_sd export now (with a histogram's and
    a counter's own series names)."""
    names = {"up"}  # Prometheus's own, one a target
    for target in json.loads(sd.read_text()):
        text = httpx.get(f"http://{target['targets'][0]}/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            names.add(fam.name)
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"),
            }
            names.update(fam.name + s for s in suffixes.get(fam.type, ()))
    return names


def test_the_alert_rules_pass_promtool():
    installed()
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, checked.stdout + checked.stderr


def test_every_series_the_dashboards_and_rules_ask_for_is_one_llmgw_exports(up):
    assert [p.name for p in DASHBOARDS] == [
        "llmgw-fleet.json",
        "llmgw-model.json",
        "llmgw-router.json",
        "llmgw-tenants.json",
    ]
    stream = {"model": DEMO, "messages": QUESTION, "max_tokens": 4, "stream": True}
    httpx.post(
        f"{up.base_url}/chat/completions", headers={"authorization": f"Bearer {up.key}"}, json=stream, timeout=60
    )
    exported = _scraped(up.home / "up" / "prometheus.json")
    for where, exprs in _exprs().items():
        for expr in exprs:
            asked = set(_SERIES.findall(expr))
            assert asked, f"{where}: {expr!r} names no series"
            assert asked <= exported, (
                f"{where}: {expr!r} asks for {sorted(asked - exported)}, which llmgw does not export"
            )


def test_prometheus_scrapes_every_service_and_a_rule_fires_when_an_engine_is_killed(up, tmp_path):
    installed()
    now = tmp_path / "rules-now.yml"  # the shipped rules, firing at once rather than after minutes
    now.write_text(re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text()))
    webhook = Webhook()
    alertmanager = Alertmanager(tmp_path / "alertmanager", webhook)
    prometheus = Prometheus(tmp_path / "prometheus", up.home / "up" / "prometheus.json", now, alertmanager)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            targets = prometheus.targets()
            if len(targets) == 5 and all(t["health"] == "up" for t in targets):
                break
            time.sleep(0.5)
        assert sorted(t["labels"]["service"] for t in targets) == ["agent", "catalog", "mirror", "router", "scheduler"]
        assert all(t["health"] == "up" for t in targets), targets
        assert sorted(float(r["value"][1]) for r in prometheus.query('up{job="llmgw"}')) == [1.0] * 5
        engines = [
            p for p in psutil.Process(up.proc.pid).children(recursive=True) if "llama-server" in " ".join(p.cmdline())
        ]
        assert engines, "no engine runs under llmgw up"
        engines[0].kill()  # the agent starts it again; meanwhile the model runs short

        def fired() -> list[dict]:
            alerts = [a for body in webhook.bodies for a in body["alerts"]]
            return [a for a in alerts if a["labels"]["alertname"] in ("LlmgwModelBelowWanted", "LlmgwEngineFailing")]

        deadline = time.monotonic() + 90
        while not fired() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert fired(), f"no alert came; Prometheus's: {prometheus.query('ALERTS')}"
        alert = fired()[0]
        assert alert["labels"]["model"] == DEMO and alert["status"] == "firing"
        assert DEMO in alert["annotations"]["summary"] and "llmgw ctl" in alert["annotations"]["description"]
    finally:
        prometheus.stop()
        alertmanager.stop()
        webhook.stop()
