"""A tool server's answer read no further than a result may be, and never compressed."""

from __future__ import annotations

import gzip

import httpx2
import pytest

from llmgw.router.tools.capped import MOST_ANSWER_BYTES as MOST
from llmgw.router.tools.capped import UNCOMPRESSED, AnswerTooLarge, cap_answer


def _client(answer: httpx2.Response, seen: list[httpx2.Request]) -> httpx2.AsyncClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer

    transport = httpx2.MockTransport(handler)
    return httpx2.AsyncClient(transport=transport, headers=UNCOMPRESSED, event_hooks={"response": [cap_answer]})


async def test_an_answer_within_the_cap_is_read_whole_and_asked_for_uncompressed():
    seen: list[httpx2.Request] = []
    async with _client(httpx2.Response(200, content=b"x" * MOST), seen) as http:
        assert len((await http.post("http://tools/mcp", json={})).content) == MOST
    assert seen[0].headers["accept-encoding"] == "identity"


async def test_an_answer_past_the_cap_is_cut_where_it_passes_it():
    pieces = iter([b"x" * MOST, b"x", b"never read"])

    async def body():
        for piece in pieces:
            yield piece

    async with _client(httpx2.Response(200, content=body()), []) as http:
        with pytest.raises(AnswerTooLarge, match="over the 4,194,304 bytes"):
            await http.post("http://tools/mcp", json={})
    assert next(pieces) == b"never read"


async def test_a_servers_own_notification_stream_is_not_a_result_and_is_not_capped():
    async with _client(httpx2.Response(200, content=b"x" * (MOST + 1)), []) as http:
        assert len((await http.get("http://tools/mcp")).content) == MOST + 1


async def test_an_answer_compressed_against_the_ask_is_refused_unread():
    packed = gzip.compress(b"x" * 100_000)  # 100 kB unpacked from a few hundred bytes
    answer = httpx2.Response(200, content=packed, headers={"content-encoding": "gzip"})
    async with _client(answer, []) as http:
        with pytest.raises(AnswerTooLarge, match=r"compressed \(gzip\)"):
            await http.post("http://tools/mcp", json={})
