"""The router's client to engines (`upstream.py`) against a real socket: a stand-in engine on
asyncio's streams that answers as told, so each way an engine can answer or fail is shown."""

import asyncio
import contextlib

import pytest

from llmgw.router.routing.health import ReplicaDown
from llmgw.router.routing.upstream import EngineError, Upstream

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextlib.asynccontextmanager
async def engine(answer):
    """A stand-in engine: `answer(reader, writer, n)` answers its n-th request (from 0) on its
    connection; it records each connection and request it saw."""
    seen = {"connections": 0, "requests": []}

    async def serve(reader, writer):
        seen["connections"] += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(line for line in head.split(b"\r\n") if line.startswith(b"content-length")).split()[1]
                )
                seen["requests"].append(head + await reader.readexactly(length))
                if await answer(reader, writer, n) is False:
                    break
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


async def test_an_answer_comes_whole_and_its_connection_is_kept_for_the_next():
    async def ok(reader, writer, n):
        writer.write(OK)

    async with engine(ok) as (url, seen):
        upstream = Upstream()
        for _ in range(3):
            answer = await upstream.post(url, "/v1/chat/completions", b'{"a":1}', {"authorization": "Bearer k"})
            assert (answer.status, answer.headers["content-type"], await answer.read()) == (
                200,
                "application/json",
                b"{}",
            )
            answer.release()
        upstream.close()
    assert seen["connections"] == 1 and len(seen["requests"]) == 3
    request = seen["requests"][0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"authorization: Bearer k\r\n" in request and request.endswith(b'\r\n\r\n{"a":1}')


async def test_a_stream_comes_piece_by_piece_as_the_engine_sends_it():
    go_on = asyncio.Event()

    async def stream(reader, writer, n):
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await go_on.wait()
        writer.write(chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    async with engine(stream) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=5)
        assert await answer.next() == b"data: 1\n\n"
        go_on.set()
        assert await answer.next() == b"data: 2\n\n" and await answer.next() == b""
        answer.release()
        upstream.close()


async def test_an_engine_silent_past_its_read_limit_fails_the_wait_and_its_connection_is_dropped():
    async def stalls(reader, writer, n):
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await asyncio.sleep(3600)

    async with engine(stalls) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=0.2)
        assert await answer.next() == b"data: 1\n\n"
        with pytest.raises(TimeoutError):
            await answer.next()
        answer.release()
        assert not upstream.pools[("127.0.0.1", int(url.rsplit(":", 1)[1]), False)]
        upstream.close()


async def test_a_stream_slower_in_all_than_its_read_limit_but_never_silent_that_long_is_read_whole():
    """One timer serves every wait (moved on lazily, not one a piece): pieces 0.1 s apart for
    over a second under a read limit of 0.3 s are all read; then a silence past it fails the
    wait; and once released, nothing of the answer is left waiting on the loop."""

    async def paced(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        for i in range(12):
            writer.write(chunk(b"data: %d\n\n" % i))
            await asyncio.sleep(0.1)
        await asyncio.sleep(3600)

    async with engine(paced) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=0.3)
        got = b""
        with pytest.raises(TimeoutError):
            while piece := await answer.next():
                got += piece
        assert got == b"".join(b"data: %d\n\n" % i for i in range(12))
        answer.release()
        assert answer._timer is None
        upstream.close()


async def test_an_exchange_past_its_whole_time_fails_even_while_the_engine_keeps_sending():
    async def drips(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        while True:
            writer.write(chunk(b": still here\n\n"))
            await asyncio.sleep(0.05)

    async with engine(drips) as (url, _):
        upstream = Upstream(total_s=0.3)
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=5)
        with pytest.raises(TimeoutError):
            while await answer.next():
                pass
        upstream.close()


async def test_a_cut_answer_raises_what_cut_it_at_once():
    async def stalls(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        await asyncio.sleep(3600)

    async with engine(stalls) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {})
        waiting = asyncio.create_task(answer.next())
        await asyncio.sleep(0.05)
        answer.fail(ReplicaDown("its engine stopped answering its health probe"))
        with pytest.raises(ReplicaDown):
            await waiting
        upstream.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", "broken answer"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", "closed the connection before its answer ended"),
    ],
)
async def test_a_broken_or_cut_short_answer_is_an_engine_error_that_says_which(answer, why):
    async def bad(reader, writer, n):
        writer.write(answer)
        return False  # and the connection closes

    async with engine(bad) as (url, _):
        upstream = Upstream()
        with pytest.raises(EngineError, match=why):
            await (await upstream.post(url, "/v1/completions", b"{}", {})).read()
        upstream.close()


async def test_a_kept_connection_the_engine_closed_is_retried_once_on_a_new_one():
    async def once_per_connection(reader, writer, n):
        if n == 0:
            writer.write(OK)
            return None
        return False  # a second request on it: closed unanswered, as an idle timeout does

    async with engine(once_per_connection) as (url, seen):
        upstream = Upstream()
        for _ in range(2):
            answer = await upstream.post(url, "/v1/completions", b"{}", {})
            assert await answer.read() == b"{}"
            answer.release()
        upstream.close()
    assert seen["connections"] == 2


async def test_no_engine_listening_is_an_engine_error_naming_where():
    async with engine(None) as (url, _):
        pass  # closed: nothing listens there now
    with pytest.raises(EngineError, match="cannot connect to 127.0.0.1:"):
        await Upstream().post(url, "/v1/completions", b"{}", {})
    with pytest.raises(EngineError, match="must be http"):
        await Upstream().post("ftp://x", "/v1/completions", b"{}", {})


async def test_an_answer_framed_by_the_connections_end_ends_there():
    async def close_framed(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}")
        return False

    async with engine(close_framed) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {})
        assert await answer.read() == b"{}"
        answer.release()
        upstream.close()


async def test_a_sink_takes_each_piece_in_the_read_callback_and_the_reader_waits_only_for_the_end():
    """The pieces a sink takes wake no reader; each counts as the engine speaking (a read limit
    shorter than the stream, longer than its gaps, holds); the end wakes the reader."""
    plugged = asyncio.Event()

    async def paced(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        await plugged.wait()
        for i in range(8):
            writer.write(chunk(b"data: %d\n\n" % i))
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")

    async with engine(paced) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=0.3)
        taken: list[bytes] = []
        answer.sink = lambda piece: taken.append(piece) is None
        plugged.set()
        assert await answer.next() == b""  # one wait, ended by the answer's end
        assert b"".join(taken) == b"".join(b"data: %d\n\n" % i for i in range(8))
        answer.release()
        upstream.close()


async def test_a_piece_the_sink_declines_waits_for_the_reader_and_those_after_it_wait_too():
    plugged, go_on = asyncio.Event(), asyncio.Event()

    async def stream(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        await plugged.wait()
        writer.write(chunk(b"data: 1\n\n"))
        await go_on.wait()
        writer.write(chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    async with engine(stream) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=5)
        offered: list[bytes] = []
        answer.sink = lambda piece: offered.append(piece) or len(offered) > 1  # declines the first
        plugged.set()
        assert await answer.next() == b"data: 1\n\n"
        go_on.set()
        assert await answer.next() == b""
        assert offered == [b"data: 1\n\n", b"data: 2\n\n"]  # the first declined, kept for the reader; the second taken
        answer.release()
        upstream.close()


async def test_a_sink_that_fails_fails_the_reader_not_the_engines_connection_callback():
    plugged = asyncio.Event()

    async def stream(reader, writer, n):
        writer.write(CHUNKED_HEAD)
        await plugged.wait()
        writer.write(chunk(b"data: 1\n\n") + b"0\r\n\r\n")

    def broken(piece):
        raise ValueError("the relay could not read it")

    async with engine(stream) as (url, _):
        upstream = Upstream()
        answer = await upstream.post(url, "/v1/completions", b"{}", {}, read_s=5)
        answer.sink = broken
        plugged.set()
        with pytest.raises(ValueError, match="could not read"):
            await answer.next()
        answer.release()
        upstream.close()
