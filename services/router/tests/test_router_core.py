"""The router's pure parts: checking a request, rewriting answers, limits, usage sums, the error body."""

import msgspec
import pytest

from llmgw.proto import Limits, Model, UsageRecord
from llmgw.router.accounts.keys import key_hash
from llmgw.router.accounts.limits import Counts, judge, windows
from llmgw.router.errors import ApiError, ModelNotFound
from llmgw.router.request.core import bucket_start, check_request, rewrite_chunk, sum_usage, usage_of

MODEL = Model(name="m", source="o/r/m.gguf", context=4096, max_output=512)
CHAT = "/v1/chat/completions"


def test_a_chunk_carries_the_asked_model_name_not_the_engines():
    out = msgspec.json.decode(rewrite_chunk({"model": "/x/y.gguf", "choices": [{"delta": {}}]}, "m", False))
    assert out["model"] == "m"


def test_the_usage_chunk_reaches_only_a_client_that_asked_for_it():
    assert rewrite_chunk({"choices": [], "usage": {"total_tokens": 3}, "timings": {}}, "m", include_usage=False) is None
    kept = msgspec.json.decode(rewrite_chunk({"choices": [], "usage": {"total_tokens": 3}, "timings": {}}, "m", True))
    assert kept["usage"] == {"total_tokens": 3} and "timings" not in kept


def test_the_error_body_has_openais_four_fields():
    err = ModelNotFound("no such model", "model")
    assert err.status == 404
    assert err.body() == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_keys_are_kept_as_sha256():
    assert key_hash("k") == "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a"


def test_a_good_chat_request_passes_with_its_prompt_text():
    checked = check_request(
        CHAT,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 100,
        },
        MODEL,
    )
    assert checked.prompt == "system: be brief\nuser: hi"
    assert checked.streaming and checked.include_usage and checked.max_tokens == 100


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ([1, 2], None, "must be a JSON object"),
        ({"model": "m"}, "messages", "needs 'messages'"),
        ({"model": "m", "messages": []}, "messages", "non-empty list"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]", "with a 'role'"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 513},
            "max_tokens",
            "gives at most 512 tokens (its longest answer)",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"},
            "max_tokens",
            "whole number",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 9}, "n", "from 1 to 4"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream", "true or false"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "temperature",
            "a number",
        ),
    ],
)
def test_a_bad_request_gets_a_400_that_names_the_field(body, param, says):
    with pytest.raises(ApiError) as caught:
        check_request(CHAT, body, MODEL)
    assert caught.value.status == 400 and caught.value.param == param and says in caught.value.message


def test_a_longest_answer_beyond_the_context_is_bounded_by_the_context():
    small = Model(name="s", source="o/r/s.gguf", context=256)
    with pytest.raises(ApiError, match="at most 256 tokens \\(its context\\)"):
        check_request("/v1/completions", {"model": "s", "prompt": "x", "max_tokens": 300}, small)


def test_usage_comes_from_openais_fields_or_llama_servers_timings():
    assert usage_of(
        {"usage": {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}}
    ) == (10, 8, 4)
    assert usage_of({"usage": {"prompt_tokens": 10, "completion_tokens": 4}, "timings": {"cache_n": 6}}) == (10, 6, 4)


def test_usage_sums_per_group_biggest_first():
    rows = sum_usage(
        [
            UsageRecord(request_id="1", time=0, key="k", project="p", model="a", prompt_tokens=5),
            UsageRecord(request_id="2", time=0, key="k", project="p", model="b", prompt_tokens=50, status=500),
            UsageRecord(request_id="3", time=0, key="k", project="p", model="a", completion_tokens=3),
        ],
        "model",
    )
    assert [(r.group, r.requests, r.errors, r.prompt_tokens + r.completion_tokens) for r in rows] == [
        ("b", 1, 1, 50),
        ("a", 2, 0, 8),
    ]


def test_usage_sums_per_group_and_time_bucket_oldest_bucket_first():
    records = [
        UsageRecord(request_id=str(i), time=t, key="k", project="p", model=m, prompt_tokens=n)
        for i, (t, m, n) in enumerate([(3599, "a", 1), (3600, "a", 2), (3601, "b", 7), (7199, "a", 4), (10, "b", 1)])
    ]
    rows = sum_usage(records, "model", bucket_s=3600)
    assert [(r.start, r.group, r.requests, r.prompt_tokens) for r in rows] == [
        (0.0, "a", 1, 1),
        (0.0, "b", 1, 1),
        (3600.0, "b", 1, 7),
        (3600.0, "a", 2, 6),
    ]
    assert bucket_start(7199.5, 3600) == 3600.0 and bucket_start(7199.5, 0) == 0.0


NOW = 1_764_720_030.0  # 2025-12-03 00:00:30 UTC


def test_windows_reset_at_the_next_utc_minute_day_and_month():
    w = windows(NOW)
    assert w["minute"] == ("202512030000", 30.0)
    assert w["day"] == ("20251203", 86400 - 30.0)
    assert w["month"][0] == "202512" and w["month"][1] == 29 * 86400 - 30.0


def test_a_limit_reached_says_which_and_a_spent_budget_says_not_to_retry():
    rpm = judge("key 'ci'", Limits(requests_per_minute=2), Counts(minute_requests=2), NOW)
    assert not rpm.ok and rpm.retry and rpm.limit == "key 'ci': requests_per_minute 2 reached (2 used)"
    assert rpm.headers["x-ratelimit-remaining-requests"] == "0" and rpm.reset_s == 30.0
    budget = judge("project 'p'", Limits(tokens_per_day=1000), Counts(day_tokens=1200), NOW)
    assert not budget.ok and not budget.retry and "tokens_per_day" in budget.limit
    assert judge("key 'ci'", Limits(requests_per_minute=2), Counts(minute_requests=1), NOW).ok
    assert judge("key 'x'", Limits(), Counts(minute_requests=10**6), NOW).ok


def test_an_admitted_request_says_how_much_of_its_budgets_is_used():
    day_month = Limits(tokens_per_day=1000, tokens_per_month=10_000)
    assert judge("key 'ci'", day_month, Counts(day_tokens=900, month_tokens=2000), NOW).budget == 0.9
    assert judge("key 'ci'", day_month, Counts(day_tokens=100, month_tokens=9500), NOW).budget == 0.95
    assert judge("key 'ci'", Limits(requests_per_minute=5), Counts(), NOW).budget == 0.0  # no budget set
