"""A message that does not validate is one sentence naming the field and what it must be: the
newcomer's commands that showed msgspec's words (`ctl model scale smol -1`, a source with a
non-hex commit, `--name 'Smol LM!'`) and the rest of msgspec's kinds."""

import msgspec
import pytest

from llmgw.proto import ModelChange, RepoAdd, plainly
from llmgw.proto.catalog import ServeModel, ServePlanAsk


def _said(obj, kind, whole="the message") -> str:
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert(obj, kind)
    return plainly(refused.value, whole)


@pytest.mark.parametrize(
    ("obj", "kind", "said"),
    [
        ({"action": "scale", "name": "smol", "scaling": {"min": -1}}, ModelChange, "scaling.min must be 0 or more"),
        (
            {"source": "org/repo@nothex/f.gguf"},
            ServePlanAsk,
            "source must be '<owner>/<repo>@<commit>/<file>' (the commit: 40 hex digits)",
        ),
        (
            {"source": "org/repo/f.gguf", "name": "Smol LM!"},
            ServeModel,
            "name must be letters, digits, '-' and '_', at most 63, starting with a letter or digit (or empty)",
        ),
        ({"source": "org/repo/f.gguf", "slots": "x"}, ServePlanAsk, "slots must be a whole number, not text"),
        ({"source": "org/repo/f.gguf", "slots": 0}, ServePlanAsk, "slots must be 1 or more"),
        ({}, ServePlanAsk, "source is missing: give it"),
        ({"repo": "nope"}, RepoAdd, "repo must be a Hugging Face repo, '<owner>/<name>'"),
        ({"action": "nope", "name": "m"}, ModelChange, "action cannot be 'nope'"),
        ({"action": "class", "name": "m", "capacity_class": "gold"}, ModelChange, "capacity_class cannot be 'gold'"),
    ],
)
def test_each_refusal_is_one_sentence_naming_the_field_and_the_fix(obj, kind, said):
    got = _said(obj, kind)
    assert got.startswith(said), got
    assert "Expected" not in got and "$." not in got and "regex" not in got


def test_a_message_of_the_wrong_kind_and_other_words_pass_through():
    assert _said([1], ServePlanAsk, "ServePlanAsk") == "ServePlanAsk must be an object, not a list"
    assert (
        plainly("JSON is malformed: trailing characters (byte 3)") == "JSON is malformed: trailing characters (byte 3)"
    )
