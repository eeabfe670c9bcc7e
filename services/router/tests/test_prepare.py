"""Preparing a request before admission, pure: its key, size, JSON, model, permission, checks,
which replica tokenizes it, and the 429 a limit gives."""

import msgspec
import pytest

from llmgw.proto import JSON_MAX_DEPTH, KeyRecord, Model, Profile, ReplicaState
from llmgw.router.accounts.keys import authorize, key_hash
from llmgw.router.accounts.limits import Verdict
from llmgw.router.errors import (
    BodyTooLarge,
    BudgetSpent,
    ExpiredKey,
    InvalidJson,
    InvalidKey,
    InvalidRequest,
    MissingKey,
    MissingModel,
    ModelNotAllowed,
    ModelNotFound,
    NotAdmin,
    RateLimited,
    UnsupportedMediaType,
)
from llmgw.router.request.prepare import (
    check_body,
    check_prompts,
    check_size,
    measure_plan,
    prepare,
    refusal,
    resolve,
)

NOW = 1_764_720_030.0
KEYS = {
    key_hash("sk-user"): KeyRecord(name="user", created=0),
    key_hash("sk-admin"): KeyRecord(name="admin", created=0, admin=True),
    key_hash("sk-old"): KeyRecord(name="old", created=0, expires=NOW - 1),
}
MODEL = Model(name="m", source="o/r/m.gguf", context=2048, aliases=["tiny"], profiles=[Profile(slots=2)])
CHAT = "/v1/chat/completions"


def test_a_key_is_named_by_the_first_16_hex_digits_of_its_hash():
    key_id, record = authorize("Bearer sk-user", KEYS, NOW)
    assert key_id == key_hash("sk-user")[:16] and record.name == "user"
    assert authorize("bearer sk-admin", KEYS, NOW, admin=True)[1].admin


@pytest.mark.parametrize(
    ("header", "admin", "kind", "says"),
    [
        ("", False, MissingKey, "send 'Authorization: Bearer <key>'"),
        ("Bearer sk-nobody", False, InvalidKey, "Incorrect API key"),
        ("Bearer sk-old", False, ExpiredKey, "expired at"),
        ("Bearer sk-user", True, NotAdmin, "use an admin key"),
    ],
)
def test_a_key_that_is_missing_unknown_expired_or_not_admin_is_refused_saying_which(header, admin, kind, says):
    with pytest.raises(kind, match=says) as refused:
        authorize(header, KEYS, NOW, admin)
    assert refused.value.status == (403 if kind is NotAdmin else 401)


def test_a_body_longer_than_the_most_is_refused_by_its_length_before_it_is_read():
    check_size(None, 10)
    check_size("10", 10)
    with pytest.raises(BodyTooLarge, match="11 bytes; the most this router takes is 10"):
        check_size("11", 10)


def test_the_body_names_a_model_by_its_name_or_an_alias():
    models = {"m": MODEL, "tiny": MODEL}.get
    body, asked, model = resolve(b'{"model": "tiny", "prompt": "x"}', models)
    assert (asked, model.name, body["prompt"]) == ("tiny", "m", "x")
    with pytest.raises(InvalidJson):
        resolve(b"{not json", models)
    with pytest.raises(MissingModel):
        resolve(b'{"prompt": "x"}', models)
    with pytest.raises(ModelNotFound, match="'nope' does not exist") as unknown:
        resolve(b'{"model": "nope"}', models)
    assert unknown.value.param == "model" and unknown.value.status == 404


def test_a_key_limited_to_some_models_may_use_only_the_names_it_lists():
    only = KeyRecord(name="only", created=0, models=["tiny"])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert prepare(CHAT, body, "tiny", MODEL, only, 4).model.name == "m"
    with pytest.raises(ModelNotAllowed, match="may not use model 'm'; it may use tiny"):
        prepare(CHAT, {**body, "model": "m"}, "m", MODEL, only, 4)


def test_a_stream_always_asks_the_engine_for_usage_and_the_client_gets_it_only_if_it_asked():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    prepared = prepare(CHAT, body, "m", MODEL, KeyRecord(name="k", created=0), 4)
    assert prepared.body["stream_options"] == {"include_usage": True}
    assert not prepared.include_usage and "stream_options" not in body  # the client's body is left as sent


def test_embeddings_have_no_prompt_blocks_and_need_no_tokens():
    prepared = prepare(
        "/v1/embeddings", {"model": "m", "input": "x" * 600}, "m", MODEL, KeyRecord(name="k", created=0), 4
    )
    assert prepared.blocks == []
    assert measure_plan(prepared, MODEL, [(_replica("a"), Profile())], primary=True) is None


def _replica(rid: str, kv_events: str = "") -> ReplicaState:
    return ReplicaState(id=rid, model="m", profile="cpu", node="n", state="ready", kv_events=kv_events)


def _chat(text: str):
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return prepare(CHAT, body, "m", MODEL, KeyRecord(name="k", created=0), 4)


def test_only_a_prompt_that_might_not_fit_or_a_replica_with_kv_events_needs_tokens():
    plain, kv = (_replica("a"), Profile(slots=2)), (_replica("b", "tcp://x:1"), Profile(slots=2))
    assert measure_plan(_chat("hi"), MODEL, [], primary=True) is None  # nobody to ask
    assert measure_plan(_chat("hi"), MODEL, [plain], primary=True) is None  # it fits whatever it becomes
    long = measure_plan(_chat("hello " * 300), MODEL, [plain], primary=True)
    assert long.replica.id == "a" and long.limit == 1024 and long.check  # 2 slots share 2048 tokens
    either = measure_plan(_chat("hi"), MODEL, [plain, kv], primary=False)
    assert either.replica.id == "b" and not either.check  # a fallback's count decides nothing


def test_a_limit_reached_is_a_429_that_says_when_it_resets_and_a_spent_budget_says_not_to_retry():
    minute = refusal(Verdict(ok=False, limit="key 'ci': requests_per_minute 2 reached (2 used)", reset_s=29.6))
    assert isinstance(minute, RateLimited) and minute.status == 429 and minute.code == "rate_limit_exceeded"
    assert minute.headers["retry-after"] == "30" and "x-should-retry" not in minute.headers
    assert minute.message == "Rate limit: key 'ci': requests_per_minute 2 reached (2 used); it resets in 30s."
    budget = refusal(Verdict(ok=False, limit="project 'p': tokens_per_day", reset_s=0.2, retry=False))
    assert isinstance(budget, BudgetSpent) and budget.type == "insufficient_quota"
    assert budget.headers == {"retry-after": "1", "x-should-retry": "false"}
    assert msgspec.json.decode(msgspec.json.encode(budget.body()))["error"]["code"] == "budget_exhausted"


def test_json_nested_too_deep_is_a_400_saying_how_deep_is_allowed_not_a_recursion_error():
    models = {"m": MODEL}.get
    for depth in (JSON_MAX_DEPTH + 1, 100_000):
        deep = b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(InvalidJson, match=f"nested deeper than {JSON_MAX_DEPTH} levels") as refused:
            resolve(deep, models)
        assert refused.value.status == 400 and refused.value.code == "json_too_deep"
        with pytest.raises(InvalidJson, match="nested deeper"):
            check_body("application/json", deep)


@pytest.mark.parametrize(
    "content_type", [None, "", "application/json", "Application/JSON; charset=utf-8", "application/merge-patch+json"]
)
def test_a_body_sent_as_json_or_without_a_type_is_read_as_json(content_type):
    check_body(content_type, b'{"a": 1}')


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_body_sent_as_anything_but_json_is_a_415_that_says_to_send_json(content_type):
    with pytest.raises(UnsupportedMediaType, match="send 'Content-Type: application/json'") as refused:
        check_body(content_type, b'{"a": 1}')
    assert refused.value.status == 415 and content_type in refused.value.message
    check_body(content_type, b"")  # no body: nothing to read as anything


def test_completions_take_at_most_the_bound_of_prompts_and_the_400_says_it():
    key = KeyRecord(name="k", created=0)
    for prompt in ("one", ["a", "b"], [1, 2, 3] * 100):
        check_prompts(prepare("/v1/completions", {"model": "m", "prompt": prompt}, "m", MODEL, key, 4), 2)
    with pytest.raises(InvalidRequest, match="at most 2 prompts; this one has 3") as refused:
        check_prompts(prepare("/v1/completions", {"model": "m", "prompt": ["a", "b", "c"]}, "m", MODEL, key, 4), 2)
    assert refused.value.param == "prompt" and refused.value.status == 400
