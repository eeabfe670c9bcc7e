"""vLLM's KV events read into what each replica holds, and a prompt's tokens matched against it."""

import msgspec
import pytest

from llmgw.proto import Model, Profile
from llmgw.router.errors import ApiError
from llmgw.router.request.core import check_context, check_request, context_of, may_exceed, tokenize_request
from llmgw.router.routing.balance import Balancer, Candidate
from llmgw.router.routing.kvevents import BlockRemoved, BlockStored, CacheView, decode_batch, token_blocks

PROMPT = list(range(100, 164))  # four blocks of 16


def wire(*events) -> bytes:
    """A batch as vLLM encodes it: [ts, [[tag, fields...], ...], data_parallel_rank]."""
    return msgspec.msgpack.encode([1.5, list(events), None])


def stored(hashes, parent, tokens, lora=None):
    return ["BlockStored", hashes, parent, tokens, 16, lora, "GPU"]  # "GPU": a later field, ignored


def test_a_batch_in_vllms_shape_is_read_and_unknown_event_kinds_are_skipped():
    ts, events = decode_batch(
        wire(stored([7, 8], None, PROMPT[:32]), ["SomethingNew", 1], ["BlockRemoved", [7], "GPU"])
    )
    assert ts == 1.5 and [type(e) for e in events] == [BlockStored, BlockRemoved]
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x01not a batch")


def test_stored_blocks_chain_across_batches_and_match_the_prompts_own_blocks():
    view = CacheView()
    view.apply(0, decode_batch(wire(stored([b"h1", b"h2"], None, PROMPT[:32])))[1])
    view.apply(1, decode_batch(wire(stored([b"h3"], b"h2", PROMPT[32:48])))[1])
    assert view.match(token_blocks(PROMPT, view.block_size)) == 3
    assert view.match(token_blocks([1] + PROMPT[1:], 16)) == 0  # the first token differs: nothing shared
    view.apply(2, decode_batch(wire(["BlockRemoved", [b"h2"], "GPU"]))[1])
    assert view.match(token_blocks(PROMPT, 16)) == 1
    view.apply(3, decode_batch(wire(["AllBlocksCleared"]))[1])
    assert view.match(token_blocks(PROMPT, 16)) == 0 and not view.keys


def test_blocks_whose_parent_was_never_seen_are_counted_not_guessed_and_gaps_are_counted():
    view = CacheView()
    view.apply(5, decode_batch(wire(stored([3], 2, PROMPT[16:32])))[1])
    view.apply(9, decode_batch(wire(stored([1], None, PROMPT[:16], lora=4)))[1])  # an adapter's: skipped
    assert (view.unchained, view.gaps, view.held) == (1, 3, set())


def test_events_say_where_the_prefix_is_over_what_the_router_believes():
    balancer = Balancer(seed=1)
    pool = [Candidate(id="a", slots=4), Candidate(id="b", slots=4)]
    blocks = [b"x", b"y"]
    balancer.served("a", blocks, 100, None)  # the router's own index believes a holds the prompt
    assert balancer.pick(pool, blocks, 0.0)[0].id == "a"
    choice, how = balancer.pick(pool, blocks, 0.0, held={"a": 0, "b": 2}.get)
    assert (choice.id, how) == ("b", "affinity")


@pytest.mark.parametrize(
    ("path", "body", "asked"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "tools": [], "max_tokens": 3},
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": []},
        ),
        ("/v1/completions", {"prompt": "once"}, {"model": "m", "prompt": "once"}),
        ("/v1/completions", {"prompt": ["once"]}, {"model": "m", "prompt": "once"}),
        ("/v1/completions", {"prompt": [5, 6, 7]}, [5, 6, 7]),
        ("/v1/completions", {"prompt": ["a", "b"]}, None),
        ("/v1/embeddings", {"input": "x"}, None),
    ],
)
def test_what_the_engine_is_asked_to_tokenize(path, body, asked):
    assert tokenize_request(path, body, "m") == asked


def test_a_prompt_and_answer_beyond_the_context_is_refused_saying_both():
    check_context(500, 12, 512, "m", "/v1/completions")
    with pytest.raises(ApiError) as refused:
        check_context(500, 13, 512, "m", "/v1/chat/completions")
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
    assert refused.value.param == "messages" and "500 tokens and asks for up to 13 more" in refused.value.message


def test_llama_server_gives_a_request_its_share_of_the_context_and_vllm_the_whole():
    model = Model(name="m", source="o/r/m.gguf", context=8192)
    assert context_of(model, Profile(slots=4)) == 2048
    assert context_of(model, Profile(engine="vllm", gpus=1, slots=64)) == 8192


@pytest.mark.parametrize(
    ("text", "max_tokens", "maybe"),
    [("short", 100, False), ("x" * 290, 10, False), ("x" * 400, 10, True), ("short", 1000, True)],
)
def test_only_a_prompt_that_might_not_fit_is_worth_tokenizing(text, max_tokens, maybe):
    checked = check_request(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens},
        Model(name="m", source="o/r/m.gguf"),
    )
    assert may_exceed(checked, 1024) is maybe
