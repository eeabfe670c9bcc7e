"""The router's own HTTP/1.1 server (`front.py`) on real sockets, with a stand-in for the OpenAI
endpoint behind it (it answers from the request alone, so only the HTTP is under test): kept
connections, whole and streamed answers, other paths handed to the app's server, and each kind
of bad input."""

import asyncio
import contextlib
import json

import msgspec
import pytest

from llmgw.router.config import RouterConfig
from llmgw.router.http.front import Front
from llmgw.router.request.relay import Answer, Relay


class Streamed(Relay):
    """A relay of given pieces; `gate`, when given, holds the second piece until it is set."""

    def __init__(self, pieces: list[bytes], gate: asyncio.Event | None) -> None:
        self.headers = {"content-type": "text/event-stream"}
        self.closed = False
        self.chunks = self._pieces(pieces, gate)

    async def _pieces(self, pieces, gate):
        for i, piece in enumerate(pieces):
            if i == 1 and gate is not None:
                await gate.wait()
            yield piece

    async def close(self) -> None:
        self.closed = True


class StandIn:
    """Stands in for `OpenAIEndpoint`: /v1/models answers whole, /v1/completions echoes its body,
    /v1/chat/completions streams it back in two pieces and [DONE]; the rest (ASGI) names its path."""

    most = 100

    def __init__(self) -> None:
        self.relays: list[Streamed] = []
        self.gate: asyncio.Event | None = None

    async def respond(self, method, path, headers, read, rid):
        body = await read()
        if path == "/v1/models":
            return Answer(200, b'{"data":[]}')
        if path == "/v1/completions":
            return Answer(200, body, {"x-seen-type": headers.get("content-type", "")})
        self.relays.append(Streamed([b"data: " + body + b"\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"], self.gate))
        return self.relays[-1]

    def refused(self, exc):
        return Answer(exc.status, msgspec.json.encode(exc.body()), exc.headers)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = json.dumps({"rest": scope["path"]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def front(most: int = 100, stand_in: StandIn | None = None, **limits):
    """The front on a free port before `stand_in` (a StandIn); `limits` are RouterConfig's fields
    for the front door."""
    stand_in = stand_in or StandIn()
    stand_in.most = most
    server = Front(stand_in, RouterConfig(http_port=0, **limits))
    await server.start()
    try:
        yield server, stand_in
    finally:
        await server.stop(1.0)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer off the connection: status, headers, body (whole or de-chunked)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in head[1:] if line)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return status, headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return (head + extra + "\r\n").encode() + body


async def test_whole_and_streamed_answers_share_one_kept_connection():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-request-id: mine\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert (status, headers["x-request-id"], body) == (200, "mine", b'{"data":[]}')
        writer.write(post("/v1/chat/completions", b"1"))
        status, headers, body = await read_answer(reader)
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert headers["content-type"] == "text/event-stream" and len(headers["x-request-id"]) == 32
        assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        writer.write(post("/v1/completions?x=1", b'{"a":1}'))
        status, headers, body = await read_answer(reader)
        assert (status, headers["x-seen-type"], body) == (200, "application/json", b'{"a":1}')
        writer.close()


async def test_other_paths_go_to_the_apps_server_also_after_an_openai_request_on_the_connection():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /api/v1/keys HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_answer(reader))[2] == b'{"rest": "/api/v1/keys"}'
        writer.write(b"GET /schema HTTP/1.1\r\nhost: x\r\n\r\n")  # the connection stays the app's
        assert (await read_answer(reader))[2] == b'{"rest": "/schema"}'
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/completions", b"{}"))
        assert (await read_answer(reader))[2] == b"{}"
        writer.write(b"GET /console HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_answer(reader))[2] == b'{"rest": "/console"}'
        writer.close()


async def test_pipelined_requests_are_answered_in_the_order_they_came():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            post("/v1/completions", b'"one"') + post("/v1/chat/completions", b"2") + post("/v1/completions", b'"3"')
        )
        bodies = [(await read_answer(reader))[2] for _ in range(3)]
        assert bodies == [b'"one"', b"data: 2\n\ndata: 2\n\ndata: [DONE]\n\n", b'"3"']
        writer.write(post("/v1/completions", b"{}") + b"GET /schema HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_answer(reader))[2] == b"{}"
        status, headers, body = await read_answer(reader)  # where it begins is not known: refused, closed
        assert status == 400 and headers["connection"] == "close" and b"connection of their own" in body
        writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (post("/v1/completions", b"x" * 101), 413, b"over 100 bytes"),
        (b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"y" * 70000 + b"\r\n\r\n", 431, b"headers are too large"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, b"not HTTP/1.1 the router can read"),
    ],
)
async def test_a_request_that_cannot_be_taken_is_told_why_and_its_connection_closed(request_bytes, status, says):
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request_bytes)
        got, headers, body = await read_answer(reader)
        assert got == status and headers["connection"] == "close" and says in body
        assert json.loads(body)["error"]["message"]
        assert await reader.read() == b""  # closed
        writer.close()


async def test_a_client_that_expects_100_continue_is_told_to_go_on():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/completions", b"")[:-2] + b"expect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"")
        assert (await read_answer(reader))[0] == 200
        writer.close()


async def test_a_client_leaving_mid_stream_closes_its_relay():
    async with front() as (server, stand_in):
        stand_in.gate = asyncio.Event()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/chat/completions", b"1"))
        await reader.readuntil(b"data: 1\n\n")  # the head left with the first piece
        writer.close()
        for _ in range(100):
            if stand_in.relays[0].closed:
                break
            await asyncio.sleep(0.01)
        assert stand_in.relays[0].closed and not server.clients


async def test_a_kept_connection_left_idle_is_closed(monkeypatch):
    monkeypatch.setattr("llmgw.router.http.connection.IDLE_S", 0.2)
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/completions", b"{}"))
        assert (await read_answer(reader))[2] == b"{}"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the router within a sweep
        writer.close()


async def test_an_http_1_0_client_gets_its_stream_unframed_and_ended_by_the_close_and_head_goes_to_the_app():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/chat/completions", b"1").replace(b"HTTP/1.1", b"HTTP/1.0"))
        head, _, body = (await reader.read()).partition(b"\r\n\r\n")  # to the connection's end
        assert b"transfer-encoding" not in head and b"connection: close" in head
        assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")  # the app's (no body)
        writer.close()


async def test_an_upgrade_goes_to_the_app_a_trailing_slash_is_the_route_and_no_100_continue_for_a_body_too_large():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n")
        assert (await read_answer(reader))[2] == b'{"rest": "/v1/models"}'  # as curl --http2 asks
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models/ HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_answer(reader))[2] == b'{"data":[]}'
        head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 101\r\nexpect: 100-continue\r\n\r\n"
        writer.write(head)
        status, _, body = await read_answer(reader)  # told at once, without asking for the body
        assert status == 413 and b"over 100 bytes" in body
        writer.close()


# The front door under attack (issue 31): each case is what a hostile probe did to the router's port.


async def closed_within(reader: asyncio.StreamReader, seconds: float = 10.0) -> bytes:
    """What the router sent until it closed the connection (fails where it stays open)."""
    return await asyncio.wait_for(reader.read(), seconds)


async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gap_s: float, piece: bytes) -> bytes:
    """Send `piece` every `gap_s` until the router ends the connection; what it sent."""
    answer = asyncio.ensure_future(closed_within(reader))
    while not answer.done():
        await asyncio.wait([answer], timeout=gap_s)
        if not answer.done():
            writer.write(piece)
    return await answer


async def gone(server: Front) -> None:
    """Until the router holds no connection."""
    for _ in range(200):
        if not server.clients:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the router still holds {len(server.clients)} connections")


async def test_a_head_that_does_not_arrive_in_time_is_answered_408_and_closed():
    async with front(client_header_timeout_s=0.3) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        answer = await trickle(reader, writer, 0.1, b"x-slow: 1\r\n")  # a byte now and then does not keep it
        assert answer.startswith(b"HTTP/1.1 408") and b"headers did not arrive within 0.3 s" in answer
        writer.close()
        await gone(server)


@pytest.mark.parametrize(("gap_s", "says"), [(0.6, b"body arrived for 0.4 s"), (0.15, b"within 0.5 s")])
async def test_a_body_that_stalls_or_trickles_past_its_deadline_is_answered_408_and_closed(gap_s, says):
    async with front(client_body_timeout_s=0.4, client_body_total_s=0.5) as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
        answer = await trickle(reader, writer, gap_s, b" ")
        assert answer.startswith(b"HTTP/1.1 408") and says in answer
        writer.close()
        await gone(server)


async def test_a_header_line_that_never_ends_is_refused_as_it_arrives():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nx-long: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 4 MiB of one line, never ended
                writer.write(b"y" * 65536)
                await writer.drain()
        answer = await closed_within(reader)
        assert answer.startswith(b"HTTP/1.1 431") and b"headers are too large" in answer
        writer.close()


async def test_a_body_announced_too_large_is_refused_at_once_without_expect():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 52428800\r\n\r\n")
        status, headers, body = await asyncio.wait_for(read_answer(reader), 5)  # no body was sent
        assert status == 413 and headers["connection"] == "close" and b"over 100 bytes" in body
        writer.close()


def chunked(path: str, pieces: list[bytes], trailer: bytes = b"", extra: bytes = b"") -> bytes:
    head = b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n" % (
        path.encode()
    )
    body = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)
    return head + extra + b"\r\n" + body + b"0\r\n" + trailer + b"\r\n"


async def test_a_trailer_never_replaces_a_header():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(chunked("/v1/completions", [b"{}"], trailer=b"content-type: text/evil\r\n"))
        status, headers, body = await read_answer(reader)
        assert (status, headers["x-seen-type"], body) == (200, "application/json", b"{}")
        writer.close()


async def test_two_authorization_headers_are_refused():
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/completions", b"{}", "authorization: Bearer a\r\nauthorization: Bearer b\r\n"))
        status, headers, body = await read_answer(reader)
        assert status == 400 and b"more than one authorization header" in body.lower()
        writer.close()


async def test_a_body_in_tiny_chunks_costs_memory_near_its_size():
    import socket
    import tracemalloc

    size = 1 << 20
    payload = chunked("/v1/models", [b"ab"] * (size // 2))

    def send_and_read(port: int) -> bytes:  # a plain socket in a thread: the test itself allocates nothing
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(payload)
            return sock.recv(4096)

    async with front(most=2 * size) as (server, _):
        tracemalloc.start()
        try:
            answer = await asyncio.to_thread(send_and_read, server.port)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert answer.startswith(b"HTTP/1.1 200")
        # a 2-byte piece kept as its own object cost ~25x the body (the probe: 105 MB for 4 MiB)
        assert peak < 4 * size, f"peak {peak / size:.1f}x the body"


async def test_pipelined_requests_whose_answers_are_not_read_stop_the_router_reading():
    many = 30000
    async with front() as (server, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.transport.set_write_buffer_limits(high=64 * 2**20)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n" * many)  # 1 MB of requests at once
        await asyncio.sleep(1.0)  # the router answers while it may; nothing is read here
        (client,) = server.clients
        assert client.transport.get_write_buffer_size() < 1 << 20, "answers piled up unread in the router"
        assert len(client.waiting) <= 1000, "requests piled up unanswered in the router"
        got = 0
        while got < many:  # reading now, every one is answered: nothing lost
            assert (await asyncio.wait_for(read_answer(reader), 10))[0] == 200
            got += 1
        writer.close()


async def open_from(server: Front, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port, local_addr=(source, 0))


async def test_with_every_connection_busy_a_newcomer_is_told_503_and_closed():
    async with front(max_connections=2, max_connections_per_client=2) as (server, stand_in):
        stand_in.gate = asyncio.Event()
        busy = [await open_from(server, f"127.0.0.{i}") for i in (2, 3)]
        for reader, writer in busy:
            writer.write(post("/v1/chat/completions", b"1"))
            await reader.readuntil(b"data: 1\n\n")
        newcomer = await open_from(server, "127.0.0.4")
        answer = await closed_within(newcomer[0])
        assert answer.startswith(b"HTTP/1.1 503") and b"connections open" in answer
        stand_in.gate.set()
        for _, writer in [*busy, newcomer]:
            writer.close()
