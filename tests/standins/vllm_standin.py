#!/usr/bin/env python3
"""A stand-in for vLLM's `vllm serve` (not vLLM): it records how it was started and answers
/health and /v1/models on --port, so the agent's handling of a vLLM engine is tested without a GPU.

`--version` prints a version; VLLM_STANDIN_RECORD names the file the argv and env go to;
VLLM_STANDIN_EXIT makes it exit with that status after answering health once.
"""

import http.server
import json
import os
import sys

if "--version" in sys.argv:
    print("0.11.0-standin")
    sys.exit(0)

record = os.environ.get("VLLM_STANDIN_RECORD")
if record:
    with open(record, "w") as f:
        json.dump({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                                                 if k in ("CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")}}, f)
port = int(sys.argv[sys.argv.index("--port") + 1])
exit_after = os.environ.get("VLLM_STANDIN_EXIT")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"{}" if self.path == "/health" else json.dumps({"data": [{"id": "standin"}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if exit_after and self.path == "/health":
            print("stand-in: exiting as asked", flush=True)
            os._exit(int(exit_after))

    def log_message(self, *args):
        pass


print(f"stand-in vllm listening on {port}", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
