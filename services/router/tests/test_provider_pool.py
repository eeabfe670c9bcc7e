"""A provider's keys as one pool: the least used key with room first, each key's own limits kept
per minute, a 429 cooling a key as long as the provider says (else longer each time), a revoked
key left alone for ten minutes, and when the pool has room again."""

from llmgw.proto.providers import ProviderKey
from llmgw.router.providers.pool import REFUSED_S, Pool

T0 = 1_800_000_000.0  # the start of a minute


def _pool(**limits: int) -> Pool:
    return Pool([ProviderKey(name=n, key="s", **limits) for n in ("a", "b", "c")])


def test_requests_spread_over_the_least_used_keys():
    pool = _pool()
    assert [pool.take(10, T0) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_a_keys_limits_hold_within_a_minute_and_a_new_minute_starts_empty():
    pool = _pool(requests_per_minute=1, tokens_per_minute=100)
    assert [pool.take(10, T0 + 1) for _ in range(4)] == ["a", "b", "c", None]
    assert pool.take(10, T0 + 61) == "a"
    big = _pool(tokens_per_minute=100)
    assert [big.take(60, T0) for _ in range(4)] == ["a", "b", "c", None]
    big.spent("a", 60, 20, T0)  # the answer used less than was held: the rest is room again
    assert big.take(60, T0) == "a"


def test_a_429_cools_a_key_as_the_provider_says_else_longer_each_time():
    pool = _pool()
    pool.cool("a", 429, 7.0, T0)
    assert "a" not in {pool.take(1, T0 + 6.9) for _ in range(4)} and pool.take(1, T0 + 7.1) == "a"
    pool.cool("b", 429, None, T0)
    pool.cool("b", 429, None, T0 + 2)
    states = pool.states(T0 + 2)
    assert states["b"].cooling_until == T0 + 4 and states["b"].why.startswith("429")
    pool.spent("b", 1, 1, T0 + 10)  # an answer: its back-off starts again
    pool.cool("b", 429, None, T0 + 10)
    assert pool.states(T0 + 10)["b"].cooling_until == T0 + 11


def test_a_revoked_key_is_left_alone_ten_minutes_and_soonest_says_when_one_is_back():
    pool = _pool()
    for name in ("a", "b", "c"):
        pool.cool(name, 401, None, T0)
    assert pool.take(1, T0 + 1) is None
    assert pool.soonest(T0 + 1) == REFUSED_S - 1
    assert pool.states(T0 + 1)["a"].why.startswith("401")
    assert pool.take(1, T0 + REFUSED_S + 1) == "a"


def test_a_request_larger_than_a_keys_minute_goes_where_the_key_has_spent_nothing():
    pool = _pool(tokens_per_minute=100)
    assert pool.take(5000, T0) == "a"  # held back for ever otherwise: its reservation is a bound, not a use
    assert pool.take(5000, T0) == "b" and pool.take(5000, T0) == "c" and pool.take(5000, T0) is None
