"""The router's front against clients that read slowly, or never: requests pipelined in small
pieces behind a slow answer stop the reading, an answer never read ends its connection, a
connection handed to the app's server keeps the head and body deadlines, and a chunked body's
trailer is bounded like a head (issue 31, and a review of its first fix)."""

import asyncio
import contextlib

from services.router.tests.test_front import StandIn, chunked, post, read_answer
from services.router.tests.test_front import front as base_front


class Reading(StandIn):
    """The stand-in whose app's server reads a request's whole body before it answers, as the
    admin API does."""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            while (await receive()).get("more_body"):
                pass
        await super().__call__(scope, receive, send)


def front(most: int = 100, **limits):
    return base_front(most, Reading(), **limits)


async def test_requests_pipelined_in_small_pieces_behind_a_slow_answer_stop_the_reading():
    async with front() as (server, stand_in):
        stand_in.gate = asyncio.Event()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/chat/completions", b"1"))
        await reader.readuntil(b"data: 1\n\n")  # being answered, slowly
        for _ in range(3000):  # one request a write, as a trickling client sends them
            writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(writer.drain(), 0.01)
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)
        (client,) = server.clients
        assert client.paused and len(client.waiting) <= 1, len(client.waiting)
        stand_in.gate.set()
        await reader.readuntil(b"0\r\n\r\n")
        for _ in range(3000):  # every one answered, in order
            assert (await asyncio.wait_for(read_answer(reader), 10))[2] == b'{"data":[]}'
        writer.close()


async def test_an_answer_its_client_never_reads_ends_the_connection():
    size = 32 << 20  # more than the sockets between hold
    async with front(most=size, client_send_timeout_s=0.3) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 16)
        writer.transport.pause_reading()  # reads nothing of its answer
        writer.write(post("/v1/completions", b'"' + b"x" * (size - 2) + b'"'))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if not server.clients:
                break
        assert not server.clients  # closed by the router, the answer's task ended with it
        writer.close()


async def test_a_connection_handed_to_the_app_keeps_the_body_deadline():
    async with front(client_body_timeout_s=0.3) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /api/v1/keys HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")  # and no body
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the app waits for the body still
        for _ in range(100):
            if not server.clients:
                break
            await asyncio.sleep(0.05)
        assert not server.clients  # closed by the router, not held for the tunnel's 300 s
        writer.close()


async def test_a_chunked_bodys_trailer_is_bounded_like_a_head():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(chunked("/v1/completions", [b"{}"], trailer=b"x-long: " + b"y" * 200_000 + b"\r\n"))
        status, headers, body = await asyncio.wait_for(read_answer(reader), 10)
        assert status == 431 and b"trailer" in body and headers["connection"] == "close"
        writer.close()
