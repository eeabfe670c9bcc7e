"""What the answer cache compares a request by (`knowledge/recall.py`): its conversation's text,
and, exactly, everything else that changes its answer (its variant)."""

import msgspec
import pytest

from llmgw.router.knowledge.augment import question_of
from llmgw.router.knowledge.recall import conversation_text, streamed_content, text_of, variant_of

ASK = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24}


@pytest.mark.parametrize(
    "delivered",
    [
        {"stream": True, "stream_options": {"include_usage": True}},
        {"temperature": 0.2},
        {"cache": "force", "user": "ann", "metadata": {"x": "y"}},
        {"model": "m-alias"},
    ],
)
def test_how_an_answer_is_delivered_or_who_asks_leaves_its_variant_alone(delivered):
    assert variant_of({**ASK, **delivered}) == variant_of(ASK)


@pytest.mark.parametrize(
    "changed",
    [
        {"max_tokens": 2},
        {"stop": ["."]},
        {"response_format": {"type": "json_object"}},
        {"seed": 7},
        {"logprobs": True},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"},
                                                   {"type": "image_url", "image_url": {"url": "data:x"}}]}]},
        {"messages": [{"role": "user", "name": "bob", "content": "What is the capital of France?"}]},
    ],
)  # fmt: skip
def test_what_changes_an_answer_changes_the_variant(changed):
    asked = {**ASK, **changed}
    assert conversation_text(asked) == conversation_text(ASK)  # the same words: only the variant tells them apart
    assert variant_of(asked) != variant_of(ASK)


def test_the_knowledge_base_and_its_edition_are_part_of_the_variant():
    plain, hr, eng = variant_of(ASK), variant_of(ASK, "hr top=0 aa"), variant_of(ASK, "eng top=0 aa")
    assert len({plain, hr, eng, variant_of(ASK, "hr top=0 bb"), variant_of(ASK, "hr top=2 aa")}) == 5
    assert variant_of(dict(reversed(list(ASK.items()))), "hr top=0 aa") == hr  # the order of fields is not


def test_a_text_part_that_is_not_text_counts_as_none_and_is_no_500():
    content = [{"type": "text", "text": None}, {"type": "text", "text": "hi"}, {"type": "text"}, "x"]
    assert text_of(content) == "hi" and text_of(3) is None and text_of("plain") == "plain"
    asked = {"messages": [{"role": "user", "content": content}]}
    assert conversation_text(asked) == "user: hi" and question_of(asked["messages"]) == "hi"


def _events(*deltas: dict, finish: str = "stop") -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return b"".join(b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def test_a_streamed_answer_that_calls_a_tool_is_not_kept():
    assert streamed_content(_events({"role": "assistant", "content": "Par"}, {"content": "is"})) == ("Paris", "stop")
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}
    assert streamed_content(_events({"role": "assistant", "content": None}, call, finish="tool_calls")) is None
    assert streamed_content(_events({"function_call": {"name": "f", "arguments": ""}})) is None
