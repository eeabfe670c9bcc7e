#!/usr/bin/env python3
"""A stand-in for vLLM's `vllm serve` (not vLLM: vLLM needs a GPU this machine lacks).

It records how it was started and answers /health and /v1/models on --port, so the agent's
handling of a vLLM engine is tested without a GPU. With --kv-events-config it also plays vLLM's
prefix cache for the router's tests, speaking vLLM's wire formats:
- POST /tokenize answers {"count", "max_model_len", "tokens"} (a prompt's UTF-8 bytes are its
  tokens; chat messages are rendered `<|role|>content` and end with `<|assistant|>`);
- POST /v1/completions and /v1/chat/completions answer one token, refuse a prompt beyond
  --max-model-len with 400 as vLLM does, report `cached_tokens`, and publish the blocks they
  stored as a KV event batch on the ZMQ endpoint (topic, 8-byte sequence, msgpack batch of
  tagged arrays), with block hashes from a seed of their own, as vLLM's are;
- POST /standin/store publishes a prompt's blocks as stored without answering it, and
  POST /standin/clear publishes AllBlocksCleared; GET /standin/stats says how many it served.

`--version` prints a version; it prints its arguments at start, as vLLM does (its key among
them); VLLM_STANDIN_RECORD names the file the argv and env go to; VLLM_STANDIN_EXIT makes it
exit with that status after answering health once.
"""

import hashlib
import http.server
import json
import os
import sys
import threading
import time

if "--version" in sys.argv:
    print("0.11.0-standin")
    sys.exit(0)


def arg(flag, default=None):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default


record = os.environ.get("VLLM_STANDIN_RECORD")
if record:
    with open(record, "w") as f:
        json.dump(
            {
                "argv": sys.argv[1:],
                "env": {k: v for k, v in os.environ.items() if k in ("CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")},
            },
            f,
        )
# vLLM prints the arguments it was given; this one prints its key too, so a test sees it hidden
print(f"non-default args: {sys.argv[1:]} api_key={os.environ.get('VLLM_API_KEY')!r}", flush=True)
port = int(arg("--port"))
exit_after = os.environ.get("VLLM_STANDIN_EXIT")
max_model_len = int(arg("--max-model-len", "4096"))
BLOCK = 16
SEED = os.urandom(8)


class Cache:
    """The blocks stored, by this engine's own hashes, and the events that say so."""

    def __init__(self, endpoint):
        import msgspec
        import zmq

        self.encode = msgspec.msgpack.encode
        self.pub = zmq.Context().socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.held, self.seq, self.served, self.lock = set(), 0, 0, threading.Lock()

    def hashes(self, tokens):
        out, parent = [], SEED
        for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
            parent = hashlib.sha256(parent + bytes(str(tokens[i : i + BLOCK]), "ascii")).digest()
            out.append(int.from_bytes(parent[-8:], "big"))
        return out

    def store(self, tokens, again=False):
        """Store the prompt's whole blocks; publish those new (all, `again`). Cached tokens."""
        hashes = self.hashes(tokens)
        with self.lock:
            cached = 0
            while cached < len(hashes) and hashes[cached] in self.held:
                cached += 1
            first = 0 if again else cached
            if first < len(hashes):
                parent = hashes[first - 1] if first else None
                stored = [
                    "BlockStored",
                    hashes[first:],
                    parent,
                    tokens[first * BLOCK : len(hashes) * BLOCK],
                    BLOCK,
                    None,
                    "GPU",
                ]
                self._publish([stored])
                self.held.update(hashes)
            return cached * BLOCK

    def clear(self):
        with self.lock:
            self.held.clear()
            self._publish([["AllBlocksCleared"]])

    def _publish(self, events):
        self.pub.send_multipart([b"", self.seq.to_bytes(8, "big"), self.encode([time.time(), events, None])])
        self.seq += 1


kv = json.loads(arg("--kv-events-config", "{}"))
cache = Cache(kv["endpoint"]) if kv.get("enable_kv_cache_events") else None


def tokens_of(body):
    if "messages" in body:
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}" for m in body["messages"]) + "<|assistant|>"
    else:
        text = body["prompt"]
    return list(text.encode())


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/standin/stats":
            return self.answer(200, {"served": cache.served if cache else 0})
        self.answer(200, {} if self.path == "/health" else {"data": [{"id": "standin"}]})
        if exit_after and self.path == "/health":
            print("stand-in: exiting as asked", flush=True)
            os._exit(int(exit_after))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if cache is None:
            return self.answer(404, {"error": "no KV events asked for"})
        if self.path == "/standin/clear":
            cache.clear()
            return self.answer(200, {})
        tokens = tokens_of(body)
        if self.path == "/tokenize":
            return self.answer(200, {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens})
        if self.path == "/standin/store":
            cache.store(tokens, again=True)
            return self.answer(200, {})
        want = body.get("max_tokens") or 1
        if len(tokens) + want > max_model_len:
            return self.answer(400, {"error": {"message": "beyond the context", "type": "BadRequestError"}})
        cached = cache.store(tokens)
        cache.served += 1
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": 1,
            "total_tokens": len(tokens) + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        choice = (
            {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "x"}}
            if "messages" in body
            else {"index": 0, "finish_reason": "length", "text": "x"}
        )
        self.answer(
            200,
            {
                "id": "standin",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [choice],
                "usage": usage,
            },
        )

    def answer(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


print(f"stand-in vllm listening on {port}", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
