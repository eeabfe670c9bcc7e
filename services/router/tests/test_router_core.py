"""The router's pure parts: picking a replica, rewriting stream chunks, the error body."""

import msgspec

from llmgw.proto import ReplicaState
from llmgw.router.core import ApiError, key_hash, pick, rewrite_chunk


def r(rid, state="ready"):
    return ReplicaState(id=rid, model="m", profile="cpu", node="n", state=state)


def test_the_ready_replica_with_fewest_requests_in_flight_is_picked():
    replicas = [r("a"), r("b"), r("c", state="starting")]
    assert pick(replicas, {"a": 3, "b": 1}, set()).id == "b"
    assert pick(replicas, {"a": 3, "b": 1}, {"b"}).id == "a"


def test_no_ready_replica_picks_none():
    assert pick([r("a", state="failed"), r("b", state="starting")], {}, set()) is None


def test_a_chunk_carries_the_asked_model_name_not_the_engines():
    out = msgspec.json.decode(rewrite_chunk(b'{"model": "/x/y.gguf", "choices": [{"delta": {}}]}', "m", False))
    assert out["model"] == "m"


def test_the_usage_chunk_reaches_only_a_client_that_asked_for_it():
    usage = b'{"choices": [], "usage": {"total_tokens": 3}, "timings": {}}'
    assert rewrite_chunk(usage, "m", include_usage=False) is None
    kept = msgspec.json.decode(rewrite_chunk(usage, "m", include_usage=True))
    assert kept["usage"] == {"total_tokens": 3} and "timings" not in kept


def test_the_error_body_has_openais_four_fields():
    err = ApiError(404, "no such model", "invalid_request_error", "model_not_found", "model")
    assert err.body() == {"error": {"message": "no such model", "type": "invalid_request_error",
                                    "param": "model", "code": "model_not_found"}}


def test_keys_are_kept_as_sha256():
    assert key_hash("k") == "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a"
