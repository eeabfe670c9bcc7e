#!/usr/bin/env python3
"""A stand-in outside guardrail service (ours, not a vendor's), speaking llmgw's documented
request and answer (`llmgw.proto.guard.ServiceAsk` / `ServiceVerdict`): it blocks a text holding
"forbidden" (category BANNED) and marks each "ID-<digits>" as INTERNAL_ID. Its MODE plays the
failures: `ok`, `slow` (answers after 5 s), `500`, `garbage` (not JSON).
`python guard_service.py PORT MODE`."""

from __future__ import annotations

import http.server
import json
import re
import sys
import time


def main(port: int, mode: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            ask = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if mode == "slow":
                time.sleep(5)
            if mode == "500":
                return self._send(500, b"inside trouble")
            if mode == "garbage":
                return self._send(200, b"<html>not a verdict</html>")
            texts = ask["texts"]
            if any("forbidden" in t for t in texts):
                return self._send(200, json.dumps({"verdict": "block", "category": "BANNED"}).encode())
            spans = [
                {"text": i, "start": m.start(), "end": m.end(), "category": "INTERNAL_ID"}
                for i, t in enumerate(texts)
                for m in re.finditer(r"ID-\d+", t)
            ]
            return self._send(200, json.dumps({"verdict": "allow", "spans": spans}).encode())

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
