"""The guardrails' pure parts: what the checks find (and what they leave, a number that fails
its check digits), placeholders stable within a request, values put back into a stream however
its chunks cut a placeholder (every cut, by hypothesis), and the narrowest policy chosen."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.proto.guard import ENTITIES, Check, Policy
from llmgw.router.guard.find import PatternError, compile_pattern, find
from llmgw.router.guard.judge import JudgeGarbage, parse_verdict
from llmgw.router.guard.policies import check_texts, index, narrowest
from llmgw.router.guard.redact import CHECK_HOLD_MOST, CheckWindow, Redaction, StreamRestorer

TEXT = (
    "ada@example.com, +44 20 7946 0958, 4111 1111 1111 1111, GB82 WEST 1234 5698 7654 32, 10.1.2.3, "
    "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"
)


def test_each_kind_is_found_and_its_lookalikes_are_not():
    found = [(f.category, TEXT[f.start : f.end]) for f in find(TEXT, ENTITIES)]
    assert [c for c, _ in found] == ["EMAIL", "PHONE", "CARD", "IBAN", "IP", "SECRET"], found
    near = "order 4111 1111 1111 1112, IBAN GB83 WEST 1234 5698 7654 32, v 1.2.3.4.5.6, 999.1.1.1, call 555-0100"
    assert find(near, ENTITIES) == []


def test_the_same_value_gets_the_same_placeholder_and_comes_back():
    redaction = Redaction()
    text = "ada@example.com wrote to bob@example.com and ada@example.com"
    redacted = redaction.redact(text, find(text, ["email"]))
    assert redacted == "<EMAIL_1> wrote to <EMAIL_2> and <EMAIL_1>"
    assert redaction.restore(redacted + " <EMAIL_9> <b>") == text + " <EMAIL_9> <b>"


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=6), st.sampled_from(["", "x < y ", "<", "a<b>"]))
def test_a_stream_gives_back_every_value_however_it_is_cut(cuts, noise):
    redaction = Redaction()
    text = f"{noise}Mail <EMAIL_1> now, <CARD_1>! {noise}<EMAIL_1>"
    redaction.placeholder("EMAIL", "ada@example.com")
    redaction.placeholder("CARD", "4111 1111 1111 1111")
    bounds = sorted({0, *(c for c in cuts if c < len(text)), len(text)})
    restorer = StreamRestorer(redaction)
    out = "".join(restorer.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)) + restorer.end()
    assert out == redaction.restore(text)


def test_every_single_cut_of_a_placeholder_is_held_until_whole():
    redaction = Redaction()
    redaction.placeholder("EMAIL", "ada@example.com")
    text = "a <EMAIL_1> b"
    for cut in range(len(text) + 1):
        restorer = StreamRestorer(redaction)
        first = restorer.feed(text[:cut])
        assert first in ("", "a", "a ") or first.startswith("a ada@example.com")  # never part of one
        assert first + restorer.feed(text[cut:]) + restorer.end() == "a ada@example.com b"


@given(st.lists(st.integers(min_value=0, max_value=len(TEXT) * 3), max_size=12))
def test_a_streamed_answer_is_checked_in_pieces_that_cut_no_finding_however_it_comes(cuts):
    text = f"{TEXT} and again: {TEXT}\nend"
    bounds = sorted({0, *(c for c in cuts if c < len(text)), len(text)})
    window, pieces = CheckWindow(lambda t: [(f.start, f.end) for f in find(t, ENTITIES)]), []
    for a, b in zip(bounds, bounds[1:], strict=False):
        pieces.append(window.feed(text[a:b]))
    pieces.append(window.end())
    assert "".join(pieces) == text
    edges, at = set(), 0
    for piece in pieces:
        at += len(piece)
        edges.add(at)
    for f in find(text, ENTITIES):  # no piece ends inside a value a check looks for
        assert not any(f.start < edge < f.end for edge in edges), (text[f.start : f.end], edges)


def test_a_window_holds_a_spaceless_run_only_up_to_its_most_and_a_judges_whole():
    window = CheckWindow(lambda t: [])
    assert window.feed("x" * (CHECK_HOLD_MOST - 1)) == ""
    assert window.feed("xx") != "" and window.end()
    whole = CheckWindow(lambda t: [], whole=True)
    assert whole.feed("a b " * 100) == "" and whole.end() == "a b " * 100


def test_a_block_stops_at_the_first_finding_and_names_its_category():
    checks = [
        Check(kind="pii", action="record", entities=["ip"]),
        Check(kind="pattern", action="block", pattern="falcon", label="CODE"),
    ]
    texts, outcome = check_texts(["host 10.0.0.1", "about falcon"], checks, "p", Redaction(), {})
    assert outcome.blocked == ("p", "CODE") and ("IP", "record") in outcome.seen and texts[0] == "host 10.0.0.1"


def test_the_narrowest_policy_wins():
    policies = {
        "t": Policy(name="t"),
        "m": Policy(name="m", applies_to="model", target="qwen"),
        "p": Policy(name="p", applies_to="project", target="web"),
        "k": Policy(name="k", applies_to="key", target="abc"),
    }
    idx = index(policies)
    assert narrowest(idx, "default", "web", "abc", "qwen").name == "k"
    assert narrowest(idx, "default", "web", "other", "qwen").name == "p"
    assert narrowest(idx, "default", "api", "other", "qwen").name == "t"
    assert narrowest(idx, "lab", "web", "abc", "qwen") is None  # another tenant's policies are not its


def test_a_pattern_re2_does_not_take_is_refused():
    with pytest.raises(PatternError, match="is not one RE2 takes"):
        compile_pattern("(?<=look)behind")


@pytest.mark.parametrize(
    ("fmt", "output", "unsafe", "categories"),
    [
        ("qwen3guard", "Safety: Safe\nCategories: None", False, []),
        ("qwen3guard", "Safety: Unsafe\nCategories: Violent", True, ["Violent"]),
        (
            "qwen3guard",
            "Safety: Controversial\nCategories: Politically Sensitive Topics",
            True,
            ["Politically Sensitive Topics"],
        ),
        ("llamaguard", "\n\nsafe", False, []),
        ("llamaguard", "\n\nunsafe\nS1", True, ["S1"]),
        ("llamaguard", "unsafe\nS1,S10", True, ["S1", "S10"]),
    ],
)
def test_the_guard_models_documented_answers_are_read(fmt, output, unsafe, categories):
    assert parse_verdict(output, fmt) == (unsafe, categories)


def test_an_answer_that_is_no_verdict_is_garbage():
    for fmt, output in (("qwen3guard", "I think it is fine."), ("llamaguard", "It's safe, I guess")):
        with pytest.raises(JudgeGarbage):
            parse_verdict(output, fmt)
    assert parse_verdict("Safety: Controversial\nCategories: Jailbreak", "qwen3guard", strict=False).unsafe is False


def test_overlaps_keep_the_surer_kind_and_cost_one_pass():
    from llmgw.router.guard.find import Found, _apart

    found = [Found(0, 10, "PHONE"), Found(2, 9, "IP"), Found(8, 20, "CARD"), Found(30, 40, "PHONE")]
    assert _apart(found) == [Found(8, 20, "CARD"), Found(30, 40, "PHONE")]  # the card beat the address
    many = [Found(i * 3, i * 3 + 2, "EMAIL") for i in range(100_000)]
    assert _apart(many) == many  # 100,000 apart: kept in one pass (a pair-wise check took minutes)


def test_a_window_never_cuts_inside_spans_that_overlap_one_another():
    text = "x " * 100 + "a b c d e f g h " + "y " * 60
    start = text.index("a b")

    def spans(t):  # two checks' findings, overlapping: the second starts inside the first
        return [(start, start + 9), (start + 6, start + 15)]

    window = CheckWindow(spans)
    out = window.feed(text)
    assert not any(s < len(out) < e for s, e in spans(text)) and out + window.end() == text
