"""A webhook receiver for the tests, run as its own process (`python tests/receiver.py PORT LOG
MODE`): an HTTP server on 127.0.0.1:PORT that appends each POST it is sent (path, headers, body)
to LOG as a JSON line and answers as MODE says: `ok` (204), `fail:N` (500 to the first N, then
204), `hang` (never answers)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time

_lock = threading.Lock()


def main(port: int, log: str, mode: str) -> None:
    fails = int(mode.split(":")[1]) if mode.startswith("fail:") else 0
    seen = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with _lock:
                seen[0] += 1
                count = seen[0]
                with open(log, "a") as out:
                    got = {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
                    out.write(json.dumps(got) + "\n")
            if mode == "hang":
                time.sleep(3600)
            status = 500 if count <= fails else 204
            self.send_response(status)
            self.send_header("content-length", "0" if status == 204 else "7")
            self.end_headers()
            if status != 204:
                self.wfile.write(b"not yet")

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
