"""A tool server's answer read no further than a result may be, and never compressed."""

from __future__ import annotations

import gzip

import httpx2
import pytest

from llmgw.router.tools.capped import TOO_LARGE, AnswerTooLarge, CappedTransport


def _client(answer: httpx2.Response, seen: list[httpx2.Request], most: int = 1000) -> httpx2.AsyncClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer

    return httpx2.AsyncClient(transport=CappedTransport(most, httpx2.MockTransport(handler)))


async def test_an_answer_within_the_cap_is_read_whole_and_asked_for_uncompressed():
    seen: list[httpx2.Request] = []
    async with _client(httpx2.Response(200, content=b"x" * 1000), seen) as http:
        assert (await http.post("http://tools/mcp", json={})).content == b"x" * 1000
    assert seen[0].headers["accept-encoding"] == "identity"


async def test_an_answer_past_the_cap_is_cut_where_it_passes_it():
    pieces = iter([b"x" * 600, b"x" * 600, b"never read"])

    async def body():
        for piece in pieces:
            yield piece

    async with _client(httpx2.Response(200, content=body()), []) as http:
        with pytest.raises(AnswerTooLarge, match="over the 4,194,304 bytes"):
            await http.post("http://tools/mcp", json={})
    assert next(pieces) == b"never read"
    assert TOO_LARGE.startswith("its result is over")


async def test_an_answer_compressed_against_the_ask_is_refused_unread():
    packed = gzip.compress(b"x" * 100_000)  # 100 kB unpacked from a few hundred bytes
    answer = httpx2.Response(200, content=packed, headers={"content-encoding": "gzip"})
    async with _client(answer, []) as http:
        with pytest.raises(AnswerTooLarge, match=r"compressed \(gzip\)"):
            await http.post("http://tools/mcp", json={})
