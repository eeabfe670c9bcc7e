"""Answers on their way back, pure: a whole answer's usage, a stream's lines and its usage, and
how a request's end becomes a usage record and a status."""

import asyncio

import msgspec

from llmgw.router.errors import ContextTooLong, NoReadyReplica
from llmgw.router.request.core import Usage, answer_of
from llmgw.router.request.outcome import Outcome, Served, Ticket, ended_by, status_of
from llmgw.router.request.sse import relay_line


def test_a_whole_answer_is_named_as_asked_and_its_usage_read_before_the_timings_go():
    raw = msgspec.json.encode(
        {
            "model": "/w/m.gguf",
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
            "timings": {"cache_n": 8},
        }
    )
    out, usage = answer_of(raw, "tiny")
    assert usage == Usage(prompt=9, cached=8, completion=2)
    assert msgspec.json.decode(out) == {
        "model": "tiny",
        "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2},
    }
    assert answer_of(b"not json", "tiny") == (b"not json", Usage())


def test_a_streams_usage_is_read_even_where_the_client_did_not_ask_for_it():
    seen = Usage()
    first, seen, chunk = relay_line(
        b'data: {"choices": [{"delta": {}}], "timings": {"cache_n": 5}}\r', "m", False, seen
    )
    assert chunk and msgspec.json.decode(first[6:]) == {"choices": [{"delta": {}}], "model": "m"}
    last, seen, _ = relay_line(
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}', "m", False, seen
    )
    assert last is None and seen == Usage(prompt=7, cached=5, completion=3)  # dropped for the client, counted here
    assert relay_line(b"data: [DONE]", "m", False, seen) == (b"data: [DONE]\n\n", seen, False)
    assert relay_line(b": keep-alive", "m", False, seen) == (None, seen, False)


def test_a_chunk_already_named_as_asked_passes_untouched_and_any_other_is_rewritten():
    plain = b'{"choices":[{"delta":{"content":"hi"}}],"model":"m"}'
    assert relay_line(b"data: " + plain, "m", False, Usage()) == (b"data: " + plain + b"\n\n", Usage(), True)
    for other in (
        b'{"choices":[{"delta":{"content":"\\"model\\":\\"m\\""}}],"model":"engine-alias"}',  # only in the text
        b'{"choices":[{"delta":{"content":"hi"}}],"model":"m2"}',
        b'{"choices":[{"delta":{}}],"model":"m","timings":{"cache_n":1}}',
    ):
        out, _, _ = relay_line(b"data: " + other, "m", False, Usage())
        assert msgspec.json.decode(out[6:])["model"] == "m" and b"timings" not in out


def test_an_outcome_is_counted_under_the_model_that_answered_else_the_one_asked_for():
    ticket = Ticket(request_id="r", key_id="k", project="p", model="big", started=0.0)
    served = Served(status=200, model="m", replica="m-1", pool="priority 0", usage=Usage(prompt=4, completion=1))
    record = Outcome(ticket=ticket, served=served, latency_s=0.5).usage_record(now=10.0)
    assert (record.model, record.replica, record.prompt_tokens, record.cached_tokens, record.time) == (
        "m",
        "m-1",
        4,
        0,
        10.0,
    )
    assert Outcome(ticket=ticket, served=Served(status=400, admitted=False), latency_s=0.0).model == "big"


def test_a_request_ends_with_its_errors_status_499_when_cancelled_else_500():
    assert status_of(ContextTooLong("too long")) == 400
    assert status_of(asyncio.CancelledError()) == 499
    assert status_of(RuntimeError("bug")) == 500


def test_a_request_refused_for_its_context_once_its_model_woke_ends_as_never_admitted():
    tried = Served(status=503)
    too_long = ended_by(tried, ContextTooLong("The prompt is 1500 tokens ..."))
    assert (too_long.status, too_long.admitted) == (400, False)  # what admitting it counted is given back
    assert ended_by(tried, NoReadyReplica("none ready")) == Served(status=503)  # admitted: it was tried
    gone = ended_by(Served(status=503, model="m", replica="m-1"), asyncio.CancelledError())
    assert (gone.status, gone.replica, gone.admitted) == (499, "m-1", True)


def test_a_streams_time_to_its_first_token_counts_from_when_the_request_arrived():
    ticket = Ticket(request_id="r", key_id="k", project="p", model="m", started=10.0)
    streamed = Outcome(ticket=ticket, served=Served(status=200, first_token=10.25), latency_s=1.0)
    assert streamed.ttft_s == 0.25 and streamed.usage_record(now=11.0).ttft_s == 0.25
    assert Outcome(ticket=ticket, served=Served(status=200), latency_s=1.0).ttft_s is None


def test_the_events_that_leave_untouched_end_where_one_mentions_usage_or_anything_else_is_there():
    from llmgw.router.request.sse import plain_events

    marker = b'"model":"m"'
    chunk = b'data: {"choices":[{"delta":{"content":"hi"}}],"model":"m"}\n\n'
    usage = b'data: {"choices":[],"model":"m","usage":{"prompt_tokens":1}}\n\n'
    done = b"data: [DONE]\n\n"
    assert plain_events(chunk * 3 + usage + done, marker) == (len(chunk) * 3, 3)
    assert plain_events(chunk + done, marker) == (len(chunk + done), 1)
    assert plain_events(done, marker) == (len(done), 0)
    for not_plain in (
        chunk.replace(b'"m"}', b'"engine-alias"}'),  # a name to rewrite
        b": keep-alive\n\n" + chunk,  # a comment (dropped, never passed on)
        chunk.replace(b"\n", b"\r\n"),
        chunk.replace(b"hi", b"data: hi"),  # the field's name inside the text: read line by line
        chunk[:-1],  # not a whole event yet
    ):
        assert plain_events(not_plain, marker) == (0, 0), not_plain
