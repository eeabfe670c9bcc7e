#!/usr/bin/env python3
"""A stand-in engine (not a model): an OpenAI-compatible server that answers a chat with what its
last user message said ("You said: ..."), whole or streamed three bytes a chunk (so that anything
in it comes split across chunks), and appends each request it was sent to a file: what the
router's guardrails let reach an engine is read there. `python echo_engine.py PORT RECORD`."""

from __future__ import annotations

import http.server
import json
import sys


def main(port: int, record: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._send(200, b'{"status": "ok"}')

        def do_POST(self) -> None:
            if not self.path.endswith("/chat/completions"):
                self._send(404, b'{"error": "a chat engine only"}')
                return
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with open(record, "a") as out:
                out.write(json.dumps(body) + "\n")
            said = next((m["content"] for m in reversed(body.get("messages", [])) if m["role"] == "user"), "")
            text = f"You said: {said}"
            usage = {"prompt_tokens": 5, "completion_tokens": len(text), "total_tokens": 5 + len(text)}
            if not body.get("stream"):
                message = {"role": "assistant", "content": text}
                answer = {
                    "id": "e",
                    "object": "chat.completion",
                    "model": body["model"],
                    "usage": usage,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
                self._send(200, json.dumps(answer).encode())
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                chunk = {
                    "id": "e",
                    "object": "chat.completion.chunk",
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": "stop" if last else None}],
                }
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            final = {
                "id": "e",
                "object": "chat.completion.chunk",
                "model": body["model"],
                "choices": [],
                "usage": usage,
            }
            self._chunk(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
