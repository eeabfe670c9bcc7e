"""A stop drains the HTTP server: no new connection from its start, the answers in flight finish,
and those still going after the grace are cut (the router's stop under `llmgw up`)."""

import asyncio
import time

import httpx
import pytest

from llmgw.bus import HttpServer


def _streaming_app(chunks: int):
    """An ASGI app whose every answer is `chunks` chunks, one each 50 ms."""

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(chunks):
                await send({"type": "http.response.body", "body": b"x\n", "more_body": True})
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b"end\n"})
        elif scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    return app


async def _read_all(chunks) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def test_an_answer_in_flight_finishes_while_new_connections_are_refused():
    server = HttpServer(_streaming_app(chunks=20), "127.0.0.1", 0)
    await server.start()
    async with httpx.AsyncClient() as client, client.stream("GET", server.url) as response:
        chunks = response.aiter_bytes()
        first = await anext(chunks)
        stopping = asyncio.create_task(server.stop(grace_s=30))
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.ConnectError):
            await httpx.AsyncClient().get(server.url)
        rest = await _read_all(chunks)
    await asyncio.wait_for(stopping, 30)
    assert (first + rest).endswith(b"end\n")


async def test_an_answer_still_going_after_the_grace_is_cut():
    server = HttpServer(_streaming_app(chunks=10_000), "127.0.0.1", 0)
    await server.start()
    async with httpx.AsyncClient() as client, client.stream("GET", server.url) as response:
        chunks = response.aiter_bytes()
        await anext(chunks)
        started = time.monotonic()
        stopping = asyncio.create_task(server.stop(grace_s=0.5))
        with pytest.raises(httpx.RemoteProtocolError):  # the chunked body ends without its last chunk
            await asyncio.wait_for(_read_all(chunks), 30)
        cut_after = time.monotonic() - started
    await asyncio.wait_for(stopping, 30)
    assert cut_after >= 0.5
