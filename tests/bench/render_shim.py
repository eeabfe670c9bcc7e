"""A stand-in for vLLM's render route in front of one llama-server, for vllm-router's cache-aware
policy in tests/bench/routing.py. vllm-router 0.1.17 matches prefixes on token ids, which it asks
every worker for (`POST /v1/chat/completions/render` or `/v1/completions/render`, answered
`{"token_ids": [...]}` by vLLM); llama-server has no such route, so without it every decision is
`missing_tokens` and the policy falls back to the least loaded worker. This answers the route
with llama-server's own chat template (`/apply-template`) and tokenizer (`/tokenize`), and passes
every other request to the engine as it came, streamed back as it goes.

    python tests/bench/render_shim.py --port 9001 --engine http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

__all__ = ["main"]

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
"""Headers that belong to one hop, not passed on."""


async def render(request: web.Request) -> web.Response:
    """The request's prompt as the engine's tokens, as vLLM's render route answers."""
    body = await request.json()
    http, engine = request.app["http"], request.app["engine"]
    auth = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    prompt = body.get("prompt", "")
    if "messages" in body:
        async with http.post(f"{engine}/apply-template", json={"messages": body["messages"]}, headers=auth) as r:
            prompt = (await r.json())["prompt"]
    asked = {"content": prompt, "add_special": True, "parse_special": True}
    async with http.post(f"{engine}/tokenize", json=asked, headers=auth) as r:
        tokens = (await r.json())["tokens"]
    return web.json_response({"token_ids": tokens})


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other request, to the engine and back."""
    http, engine = request.app["http"], request.app["engine"]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    async with http.request(request.method, engine + request.path_qs, data=await request.read(), headers=headers) as r:
        out = web.StreamResponse(status=r.status, headers={k: v for k, v in r.headers.items() if k.lower() not in HOP})
        await out.prepare(request)
        async for piece in r.content.iter_any():
            await out.write(piece)
        await out.write_eof()
        return out


async def app(engine: str) -> web.Application:
    """The shim for `engine`."""
    application = web.Application(client_max_size=64 * 2**20)
    application["engine"] = engine.rstrip("/")

    async def session(application: web.Application):
        application["http"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        yield
        await application["http"].close()

    application.cleanup_ctx.append(session)
    application.router.add_post("/v1/chat/completions/render", render)
    application.router.add_post("/v1/completions/render", render)
    application.router.add_route("*", "/{path:.*}", passthrough)
    return application


def main() -> None:
    """The command line above."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True)
    args = parser.parse_args()
    web.run_app(app(args.engine), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
