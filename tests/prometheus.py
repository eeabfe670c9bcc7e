"""Debian's Prometheus and Alertmanager started for a test, as an operator would point them at
llmgw: Prometheus discovers llmgw's services from the file `llmgw up` writes (file_sd), loads
llmgw's alert rules and sends what fires to Alertmanager, which posts it to a webhook receiver
of the test's (`Webhook`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from llmgw.bus import free_port

__all__ = ["RULES", "Alertmanager", "Prometheus", "Webhook", "installed"]

RULES = Path(__file__).parent.parent / "deploy" / "prometheus" / "llmgw-rules.yml"
"""The alert rules llmgw ships."""


def installed() -> None:
    """AssertionError saying how to install them where Prometheus or Alertmanager is missing."""
    missing = [p for p in ("prometheus", "promtool", "prometheus-alertmanager") if shutil.which(p) is None]
    assert not missing, f"{', '.join(missing)} missing: `./dev` installs Debian's prometheus, prometheus-alertmanager"


class Webhook:
    """An HTTP receiver Alertmanager posts alerts to; keeps every body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers.get("content-length", 0)))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def _started(argv: list[str], log: Path, ready_url: str) -> subprocess.Popen:
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{argv[0]} did not come up:\n{log.read_text()[-2000:]}")


class Alertmanager:
    """Alertmanager sending every alert at once to `webhook`."""

    def __init__(self, folder: Path, webhook: Webhook) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "route": {"receiver": "test", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [{"url": webhook.url, "send_resolved": False}]}],
        }
        (folder / "alertmanager.yml").write_text(json.dumps(config))
        self.port = free_port()
        argv = [
            "prometheus-alertmanager",
            f"--config.file={folder / 'alertmanager.yml'}",
            f"--storage.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]
        self.proc = _started(argv, folder / "alertmanager.log", f"http://127.0.0.1:{self.port}/-/ready")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Prometheus:
    """Prometheus scraping the targets in `file_sd` every second with `rules` loaded (sending to
    `alertmanager`, where given)."""

    def __init__(self, folder: Path, file_sd: Path, rules: Path, alertmanager: Alertmanager | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "llmgw", "file_sd_configs": [{"files": [str(file_sd)]}]}],
        }
        if alertmanager is not None:
            targets = [f"127.0.0.1:{alertmanager.port}"]
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
        (folder / "prometheus.yml").write_text(json.dumps(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.proc = _started(argv, folder / "prometheus.log", f"{self.url}/-/ready")

    def query(self, expr: str) -> list[dict]:
        """The instant vector `expr` gives now."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def targets(self) -> list[dict]:
        """The targets it scrapes, with their health."""
        return httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
