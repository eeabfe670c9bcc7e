"""The SSE fast path (`plain_events`: events passed on in one piece) equals the slow one
(`relay_line`, line by line) for any stream an engine may send, cut into pieces anywhere: the same
bytes to the client, the same usage, the same chunks counted."""

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.request.core import Usage
from llmgw.router.request.sse import StreamRelay, relay_line

ASKED = "m"
"""The name the client asked for; engines also answer as 'engine-name'."""


def _chunk(name: str, text: str) -> bytes:
    return msgspec.json.encode({"id": "c", "model": name, "choices": [{"index": 0, "delta": {"content": text}}]})


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
_event = st.one_of(
    _text.map(lambda t: b"data: " + _chunk(ASKED, t) + b"\n\n"),  # as the client gets it: most chunks
    _text.map(lambda t: b"data: " + _chunk("engine-name", t) + b"\n\n"),  # named otherwise: rewritten
    _text.map(lambda t: b"data: " + _chunk(ASKED, t) + b"\r\n\r\n"),  # carriage returns
    _text.map(lambda t: b"data:" + _chunk(ASKED, t) + b"\n\n"),  # no space after the colon
    st.integers(0, 999).map(
        lambda n: b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}\n\n'
        % (n, n + 1)
    ),
    st.integers(0, 999).map(lambda n: b'data: {"model":"m","choices":[],"timings":{"prompt_n":%d}}\n\n' % n),
    st.just(b": keep-alive\n\n"),  # a comment
    st.just(b"data: not json\n\n"),
    st.just(b"data: [1, 2]\n\n"),  # JSON, not an object
    st.just(b"data: [DONE]\n\n"),
)


def _slow(stream: bytes, include_usage: bool) -> tuple[bytes, Usage, int]:
    """The reference: every line through `relay_line`, the stream whole."""
    out, usage, chunks = [], Usage(), 0
    for line in stream.split(b"\n"):
        event, usage, chunk = relay_line(line, ASKED, include_usage, usage)
        chunks += chunk
        out.append(event or b"")
    return b"".join(out), usage, chunks


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(_event, max_size=12),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
    include_usage=st.booleans(),
    no_last_newline=st.booleans(),
)
def test_the_fast_path_equals_the_slow_one_for_any_stream_cut_anywhere(events, cuts, include_usage, no_last_newline):
    stream = b"".join(events)
    if no_last_newline and stream.endswith(b"\n\n"):
        stream = stream[:-2]  # the engine closed after a last line with no newline
    at = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *at], [*at, len(stream)], strict=True) if b > a]
    relay = StreamRelay(ASKED, include_usage)
    sent = b"".join(relay.feed(p) for p in pieces) + relay.end()
    assert (sent, relay.usage, relay.chunks) == _slow(stream, include_usage)
