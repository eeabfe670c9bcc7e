#!/usr/bin/env python3
"""A stand-in for an outside provider (ours, not a model): an OpenAI-compatible HTTP server that
holds each of its keys to a number of requests a window (a 429 with `retry-after` past it),
refuses a revoked key (401), and answers a chat with what it was asked ("[<model>] You said:
..."), whole or streamed. A prompt holding "slow" waits 3 s before its first byte; one holding
"cut" streams two chunks, then drops the connection; a model `--renamed` is one it no longer knows
(404). GET /stats says how many requests each key
had answered. `python openai_provider.py --key NAME:SECRET:LIMIT ... [--revoked SECRET] [--window S]`;
it prints `listening on <port>`."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time

from aiohttp import web


def main() -> None:
    """Serve until killed."""
    ask = argparse.ArgumentParser()
    ask.add_argument("--key", action="append", default=[], help="NAME:SECRET:LIMIT (requests a window; 0: none)")
    ask.add_argument("--revoked", action="append", default=[])
    ask.add_argument("--window", type=float, default=60.0, help="seconds a limit counts over")
    ask.add_argument("--renamed", action="append", default=[], help="a model it no longer knows by that name")
    args = ask.parse_args()
    keys = {secret: (name, int(limit)) for name, secret, limit in (k.split(":") for k in args.key)}
    used: dict[str, list[float]] = {name: [] for name, _ in keys.values()}
    answered: dict[str, int] = {name: 0 for name, _ in keys.values()}

    async def chat(request: web.Request) -> web.StreamResponse:
        secret = request.headers.get("authorization", "").removeprefix("Bearer ")
        if secret in args.revoked or secret not in keys:
            return web.json_response(
                {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, status=401
            )
        name, limit = keys[secret]
        now = time.time()
        used[name] = [t for t in used[name] if t > now - args.window]
        if limit and len(used[name]) >= limit:
            wait = max(1, round(used[name][0] + args.window - now))
            error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
            return web.json_response(error, status=429, headers={"retry-after": str(wait)})
        used[name].append(now)
        body = await request.json()
        if body["model"] in args.renamed:
            gone = {"message": f"The model `{body['model']}` does not exist", "code": "model_not_found"}
            return web.json_response({"error": gone}, status=404)
        said = next((m["content"] for m in reversed(body.get("messages", [])) if m["role"] == "user"), "")
        text = f"[{body['model']}] You said: {said}"
        usage = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}
        if "slow" in said:
            await asyncio.sleep(3)
        answered[name] += 1
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            answer = {
                "id": "p",
                "object": "chat.completion",
                "model": body["model"],
                "usage": usage,
                "choices": [choice],
            }
            return web.json_response(answer)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        for i, piece in enumerate(pieces):
            if "cut" in said and i == 2:
                request.transport.close()  # the provider goes away mid-answer
                return response
            delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            chunk = {"id": "p", "object": "chat.completion.chunk", "model": body["model"], "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {"id": "p", "object": "chat.completion.chunk", "model": body["model"], "choices": [], "usage": usage}
        await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(answered)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
