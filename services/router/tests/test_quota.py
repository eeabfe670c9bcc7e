"""Budgets that cannot be overspent: what a request may use is held at admission and settled on
what it used (pure: `judge`, `reservation`, `cut_usage`), on real JetStream KV shared by two
routers, and counted locally while NATS is away."""

import asyncio

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import KeyWrongLastSequenceError

from llmgw.bus import kv_bucket
from llmgw.proto import BUCKETS, Limits, Model
from llmgw.router.accounts import counting
from llmgw.router.accounts.counters import STAMP_S, Mine, Op, Snapshot, Terms, Written, counted, written
from llmgw.router.accounts.limits import Counts, Lease, Verdict, judge, standing
from llmgw.router.accounts.quota import Quota
from llmgw.router.request.core import check_request, cut_usage, reservation

NOW = 1764720030.0
MODEL = Model(name="m", source="o/r/m.gguf", context=4096, max_output=512)
CHAT = "/v1/chat/completions"


def test_a_token_limit_takes_a_request_only_where_what_it_may_use_fits_with_what_others_hold():
    limits = Limits(tokens_per_day=1000)
    assert judge("key 'k'", limits, Counts(day_tokens=600, reserved=300), NOW, reserve=100).ok
    held = judge("key 'k'", limits, Counts(day_tokens=600, reserved=300), NOW, reserve=101)
    assert not held.ok and held.retry  # what the requests in flight hold may come back
    assert held.limit == (
        "key 'k': tokens_per_day 1000 reached "
        "(600 used, 300 held by requests in flight; this request may use up to 101)"
    )
    spent = judge("key 'k'", limits, Counts(day_tokens=950), NOW, reserve=100)
    assert not spent.ok and not spent.retry  # nothing in flight: only the reset helps
    assert not judge("key 'k'", limits, Counts(day_tokens=1000), NOW).ok  # at least one token must fit


def test_a_request_holds_its_prompt_bound_and_its_longest_answer_within_the_context():
    asked = check_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hello"}]}, MODEL)
    assert reservation(asked) == 11 * 3 + 64 + 32 + 2 + 512  # "user: hello" at 3 a byte, markers, max_output
    short = check_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}, MODEL)
    assert reservation(msgspec.structs.replace(short, tokens=[1] * 20)) == 28  # measured: its tokens
    two = check_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, MODEL)
    assert reservation(msgspec.structs.replace(two, tokens=[1] * 20)) == 20 + 512 * 2
    huge = check_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}, MODEL)
    assert reservation(huge) == MODEL.context  # a prompt and its answer never pass the context


def test_a_stream_cut_before_its_usage_is_billed_its_prompt_and_each_chunk_relayed():
    asked = check_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}, MODEL)
    assert cut_usage(asked, 5).total == 5 + 5  # "user: hello there": 17 bytes, a quarter of them rounded up
    assert cut_usage(msgspec.structs.replace(asked, tokens=[1] * 9), 0).total == 9


async def test_two_routers_admitting_64_requests_at_once_never_pass_a_budget(nc):
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    routers = [Quota(kv, "router-a"), Quota(kv, "router-b")]
    scope = [("key.k", "key 'k'", Limits(tokens_per_day=1000))]

    async def one(i):
        quota = routers[i % 2]
        if not (await quota.admit(scope, NOW, reserve=100)).ok:
            return 0
        await asyncio.sleep(0.05)  # in flight
        await quota.finish(scope, 100, NOW + 1, reserve=100)  # it used all it held
        return 100

    spent = sum(await asyncio.gather(*(one(i) for i in range(64))))
    value = msgspec.json.decode((await kv.get("key.k")).value)
    print(f"\n64 requests at once over two routers, 100 tokens each, budget 1000: {spent} spent")
    assert 0 < spent <= 1000 and value["d"][1] == spent and not value.get("h") and not value.get("c")


async def test_an_end_the_counters_never_heard_does_not_lock_a_key_and_what_was_counted_away_is_sent_later(nc):
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    online = [True]
    quota = Quota(kv, "router-a", online=lambda: online[0])
    scope = [("key.k", "key 'k'", Limits(concurrent=2, requests_per_minute=5, tokens_per_day=10_000))]
    for _ in range(2):
        assert (await quota.admit(scope, NOW, reserve=50)).ok
    online[0] = False  # NATS away: both end unheard, and more come
    for _ in range(2):
        await quota.finish(scope, 30, NOW + 1, reserve=50)
    assert (await quota.admit(scope, NOW + 2, reserve=50)).ok  # from the counts last read, and its own
    await quota.finish(scope, 30, NOW + 3, reserve=50)
    admitted = [(await quota.admit(scope, NOW + 4, reserve=50)).ok for _ in range(3)]
    assert admitted == [True, True, False]  # 5 a minute: 2 counted in KV, then 3 here
    for _ in range(2):
        await quota.finish(scope, 0, NOW + 5, reserve=50)
    assert not (await kv.get("key.k")).value.count(b'"m":["202512030000",5')  # nothing written while away
    online[0] = True
    await quota.refresh(NOW + 6)  # what keep_alive does: what was counted here is written
    value = msgspec.json.decode((await kv.get("key.k")).value)
    assert value["m"][1] == 5 and value["d"][1] == 90 and not value.get("c") and not value.get("h")
    assert not (await quota.admit(scope, NOW + 7, reserve=50)).ok  # the minute's 5 requests
    assert not quota.mine and not quota.dirty


async def test_reading_a_scopes_counts_changes_nothing_and_an_unknown_scope_reads_as_unused(nc):
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    scope = [("key.k", "key 'k'", Limits(concurrent=3, tokens_per_day=10_000))]
    assert (await quota.admit(scope, NOW, reserve=50)).ok
    assert (await quota.admit(scope, NOW, reserve=50)).ok
    await quota.finish(scope, 30, NOW + 1, reserve=50)
    await _written(quota, kv, "key.k")  # the second was admitted from a lease: written in the background
    revision = (await kv.get("key.k")).revision
    counts = await quota.read("key.k", NOW + 2)
    assert (counts.minute_requests, counts.day_tokens, counts.concurrent, counts.reserved) == (2, 30, 1, 50)
    assert (await kv.get("key.k")).revision == revision
    assert await Quota(kv, "router-b").read("key.unknown", NOW) == Counts()
    assert standing(Limits(concurrent=3, tokens_per_day=10_000), counts) == [
        ("concurrent", 3, 1),
        ("tokens_per_day", 10_000, 30),
    ]


def test_a_hold_larger_than_a_limit_passes_when_nothing_else_is_used_or_held():
    limits = Limits(tokens_per_minute=1000)
    quiet = judge("key 'k'", limits, Counts(), 0.0, reserve=8192)  # no max_tokens: the model's longest answer
    busy = judge("key 'k'", limits, Counts(minute_tokens=10), 0.0, reserve=8192)
    assert quiet.ok and not busy.ok and busy.retry


async def test_requests_at_once_on_one_key_are_counted_together_each_checked_in_turn(nc):
    """Admissions waiting on one scope go to KV together (one compare-and-set for a batch, not
    two round trips each one after another), and each is still judged with those before it."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    roomy = [("key.a", "key 'a'", Limits(concurrent=100, requests_per_minute=1000))]
    assert (await quota.admit(roomy, NOW)).ok
    first = (await kv.get("key.a")).revision
    assert all(v.ok for v in await asyncio.gather(*(quota.admit(roomy, NOW) for _ in range(63))))
    entry = await kv.get("key.a")
    assert msgspec.json.decode(entry.value)["c"]["router-a"][0] == 64
    print(f"\n63 admissions at once: {entry.revision - first} writes")
    assert entry.revision - first < 63 / 4

    tight = [("key.b", "key 'b'", Limits(concurrent=10, requests_per_minute=1000))]
    verdicts = await asyncio.gather(*(quota.admit(tight, NOW) for _ in range(64)))
    assert sum(v.ok for v in verdicts) == 10
    assert "concurrent 10 reached" in next(v for v in verdicts if not v.ok).limit
    value = msgspec.json.decode((await kv.get("key.b")).value)
    assert value["m"][1] == 10 and value["c"]["router-a"][0] == 10  # only the admitted are counted


async def test_one_request_after_another_costs_one_write_each_its_end_going_with_the_next_admission(nc):
    """A client asking one request after another: each request's end waits (briefly) for the
    next admission and goes in its write, judged first, so a key allowed one request at a time
    still takes the next at once."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    quota.end_wait_s = 5.0  # however slow this machine, an end waits for the next admission here
    one_at_a_time = [("key.s", "key 's'", Limits(concurrent=1))]
    assert (await quota.admit(one_at_a_time, NOW)).ok
    first = (await kv.get("key.s")).revision
    ends = []
    for i in range(1, 11):
        ends.append(asyncio.create_task(quota.finish(one_at_a_time, 1, NOW + i - 0.5)))  # as the router tells it
        await asyncio.sleep(0.01)  # the client reads its answer and asks again
        assert (await quota.admit(one_at_a_time, NOW + i)).ok
    await asyncio.gather(*ends)
    assert (await kv.get("key.s")).revision - first == 10  # ten admissions, each with the end before it
    quota.end_wait_s = 0.05
    await quota.finish(one_at_a_time, 1, NOW + 11)  # with nothing after it: written alone, soon
    value = msgspec.json.decode((await kv.get("key.s")).value)
    assert "router-a" not in value.get("c", {})


ROOMY = Limits(requests_per_minute=100_000, concurrent=1_000, tokens_per_day=10**9)


async def _written(quota, kv, sid):
    """The scope's entry once what `quota` counted there is written (its background write done)."""
    for _ in range(100):
        if sid not in quota.dirty and not quota.waiting.get(sid) and sid not in quota.writing:
            break
        await asyncio.sleep(0.02)
    return msgspec.json.decode((await kv.get(sid)).value)


async def test_far_from_its_limits_a_key_is_admitted_from_a_lease_and_counted_in_the_background(nc):
    """Request after request on a roomy key: admitted from this router's lease of the headroom,
    not one write each; every request and token still reaches KV, and the lease counts as used
    for the other routers meanwhile."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    scope = [("key.r", "key 'r'", ROOMY)]
    assert (await quota.admit(scope, NOW, reserve=50)).ok
    first = (await kv.get("key.r")).revision
    for i in range(200):
        verdict = await quota.admit(scope, NOW + i / 1000, reserve=50)
        assert verdict.ok and verdict.headers["x-ratelimit-remaining-requests"] == str(100_000 - i - 2)
        await quota.finish(scope, 20, NOW + i / 1000, reserve=50)
    await quota.finish(scope, 20, NOW + 0.2, reserve=50)
    value = await _written(quota, kv, "key.r")
    writes = (await kv.get("key.r")).revision - first
    print(f"\n200 requests one after another on a roomy key: {writes} writes")
    assert writes < 200 / 4
    assert value["m"][1] == 201 and value["d"][1] == 201 * 20 and not value.get("c") and not value.get("h")
    _, requests, tokens, concurrent, _ = value["l"]["router-a"]  # leased: the other routers count it
    seen = await Quota(kv, "router-b").read("key.r", NOW + 1)
    assert requests > 0 and tokens > 0 and concurrent > 0 and seen.minute_requests == 201  # a read is what was used


async def test_an_end_on_a_leased_scope_is_counted_at_once_and_only_the_others_are_left_to_write(nc):
    """The router tells a request's end without a task where it holds a lease of the scope (its
    count drops now, written in the background); a scope it holds no lease of is left to
    `finish`, which writes it; a scope whose limits count nothing in flight needs neither."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    leased, unleased = ("key.l", "key 'l'", ROOMY), ("project.u", "project 'u'", ROOMY)
    per_minute = ("key.m", "key 'm'", Limits(requests_per_minute=1000))
    for _ in range(2):  # the first write takes the lease, the second is admitted from it
        assert (await quota.admit([leased], NOW, reserve=50)).ok
    assert quota.mine["key.l"].lease is not None and quota.mine["key.l"].n == 2
    assert quota.finish_leased([leased, unleased, per_minute], 20, NOW + 0.01, reserve=50) == [unleased]
    assert quota.mine["key.l"].n == 1  # counted here, at once
    await quota.finish([leased], 20, NOW + 0.02, reserve=50)
    value = await _written(quota, kv, "key.l")
    assert value["m"][1] == 2 and value["d"][1] == 40 and not value.get("c") and not value.get("h")


async def test_leases_never_let_routers_pass_a_limit_and_one_router_alone_reaches_it_exactly(nc):
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    a, b = Quota(kv, "router-a"), Quota(kv, "router-b")
    scope = [("key.t", "key 't'", Limits(requests_per_minute=300, concurrent=100))]

    async def one(quota, at):
        if not (await quota.admit(scope, at)).ok:
            return 0
        await quota.finish(scope, 0, at)
        return 1

    admitted = 0
    for i in range(200):  # the two take turns, each admitting from its own lease where it can
        admitted += await one(a, NOW + i / 1000) + await one(b, NOW + i / 1000)
    value = await _written(b, kv, "key.t")
    value = await _written(a, kv, "key.t")
    print(f"\n400 requests over two leasing routers, 300 a minute: {admitted} admitted")
    assert 250 <= admitted <= 300 and value["m"][1] == admitted  # the leases held back the rest
    alone = Quota(kv, "router-c")
    solo = [("key.u", "key 'u'", Limits(requests_per_minute=300, concurrent=1000))]
    verdicts = [await alone.admit(solo, NOW + i / 1000) for i in range(400)]
    assert sum(v.ok for v in verdicts) == 300 and "requests_per_minute 300 reached" in verdicts[-1].limit


async def test_a_lease_counts_for_the_others_until_it_is_lease_s_old_then_its_headroom_is_theirs(nc):
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    a, b = Quota(kv, "router-a"), Quota(kv, "router-b")
    scope = [("key.l", "key 'l'", Limits(requests_per_minute=100))]
    assert (await a.admit(scope, NOW)).ok  # router-a, alone there, leases the 16 it wants of the 99 left
    a.stop()  # router-a goes away holding its lease
    taken = [(await b.admit(scope, NOW + 1)).ok for _ in range(100)]
    assert sum(taken) == 100 - 1 - 16
    assert (await b.admit(scope, NOW + 1 + a.lease_s)).ok  # router-a's lease has lapsed
    assert sum([(await b.admit(scope, NOW + 1 + a.lease_s)).ok for _ in range(60)]) == 100 - 85


async def test_one_router_alone_leases_a_small_concurrency_limit_and_a_router_that_comes_gets_in(nc):
    """A key with 7 requests in flight allowed, asked one at a time through one router: admitted
    from a lease (half of what is left: no other router counts there), not a write each; a second
    router that comes is admitted beside it, and the two never hold more than 7 at once."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    a, b = Quota(kv, "router-a"), Quota(kv, "router-b")
    scope = [("key.c", "key 'c'", Limits(concurrent=7))]
    assert (await a.admit(scope, NOW)).ok
    await a.finish(scope, 0, NOW)
    first = (await kv.get("key.c")).revision
    for i in range(100):
        assert (await a.admit(scope, NOW + i / 1000)).ok
        await a.finish(scope, 0, NOW + i / 1000)
    await _written(a, kv, "key.c")
    writes = (await kv.get("key.c")).revision - first
    print(f"\n100 requests one after another on a key of 7 in flight: {writes} writes")
    assert writes < 100 / 4
    held_a = sum([(await a.admit(scope, NOW + 0.2)).ok for _ in range(2)])
    held_b = sum([(await b.admit(scope, NOW + 0.2)).ok for _ in range(7)])
    assert held_a == 2 and held_b >= 1 and held_a + held_b <= 7


async def test_routers_admitting_at_once_from_leases_while_their_writes_are_on_the_way_never_pass_a_limit(nc):
    """Requests arriving together on two routers, each admitted from its lease while that
    router's write is on its way, or judged on KV: never more than the limit, every admission
    in KV once written."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    routers = [Quota(kv, "router-a"), Quota(kv, "router-b")]
    scope = [("key.w", "key 'w'", Limits(requests_per_minute=300, concurrent=1000, tokens_per_day=10**6))]

    async def one(i):
        await asyncio.sleep(i % 7 / 1000)
        quota = routers[i % 2]
        if not (await quota.admit(scope, NOW + i / 10_000, reserve=10)).ok:
            return 0
        await quota.finish(scope, 5, NOW + i / 10_000, reserve=10)
        return 1

    admitted = sum(await asyncio.gather(*(one(i) for i in range(500))))
    for quota in routers:
        value = await _written(quota, kv, "key.w")
    print(f"\n500 requests at once over two leasing routers, 300 a minute: {admitted} admitted")
    assert 150 <= admitted <= 300 and value["m"][1] == admitted and value["d"][1] == 5 * admitted


async def test_a_write_is_dated_by_the_clock_not_by_how_long_its_changes_waited(nc):
    """A refresh told an old time (it wrote other scopes first) is dated as late as time has
    passed since a later one: the others must not drop its lease before its owner stops
    spending it. A window a router ahead of this one already opened is kept, not reset."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    scope = [("key.d", "key 'd'", Limits(concurrent=10))]
    assert (await quota.admit(scope, NOW)).ok
    await asyncio.sleep(0.3)
    await quota.refresh(NOW - 10)
    value = msgspec.json.decode((await kv.get("key.d")).value)
    assert value["c"]["router-a"][1] >= NOW + 0.3
    ahead = {"m": ["202512030001", 7, 70], "d": ["20251203", 70], "mo": ["202512", 70]}
    assert counted(ahead, [], NOW)["m"] == ["202512030001", 7, 70]  # NOW is 00:00 of that day


async def test_requests_admitted_from_a_lease_are_kept_as_one_change_a_minute_however_many_come(nc):
    """A thousand requests one after another on a leased key of 7 in flight, no write between
    (its flush is far off): kept as one unsent change, not one each (the next write's work, done
    on the event loop beside the requests, does not grow with them); KV hears every one."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    quota.flush_s = 3600.0
    scope = [("key.f", "key 'f'", Limits(concurrent=7))]
    assert (await quota.admit(scope, NOW)).ok  # the first write takes the lease
    for i in range(1000):
        assert (await quota.admit(scope, NOW + i / 2000)).ok
        assert quota.finish_leased(scope, 3, NOW + i / 2000) == []
    mine = quota.mine["key.f"]
    assert len(mine.unsent) <= 2 and (mine.unsent_requests, mine.unsent_tokens) == (1000, 3000)
    quota._flush("key.f")
    await quota.finish(scope, 3, NOW + 0.6)
    value = await _written(quota, kv, "key.f")
    assert value["m"][1:] == [1001, 3003] and not value.get("c")


_CHANGES = st.lists(
    st.one_of(
        st.tuples(st.just("keep"), st.integers(0, 150), st.integers(-1, 2), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("seal")),
        st.tuples(st.just("sent")),
    ),
    max_size=40,
)


@given(_CHANGES, st.integers(0, 5))
def test_changes_kept_folded_count_as_they_would_one_by_one_and_a_write_on_its_way_keeps_its_own(changes, before):
    """However changes come (requests given back among them, minutes apart, writes taking what is
    unsent and coming back), the unsent changes count in KV's windows as the same changes one by
    one would, and a write's own are never changed while it is on its way."""
    mine, raw, carried = Mine(), [], None
    for change in changes:
        if change[0] == "keep":
            _, second, requests, tokens, late = change
            op = Op(at=NOW + second, when=NOW + second - 61 if late else None, requests=requests, tokens=tokens)
            mine.keep(op)
            raw.append(op)
        elif change[0] == "seal":
            carried = (mine.seal(), list(mine.unsent), len(raw))
        elif carried is not None:  # the write taken last is in KV
            count, ops, raw_count = carried
            assert mine.unsent[:count] == ops[:count] and mine.sealed <= len(mine.unsent)
            mine.drop_sent(count)
            raw, carried = raw[raw_count:], None
    value = {"m": [counted({}, [], NOW)["m"][0], before, 0]}
    for now in (NOW + 30, NOW + 150):
        assert counted(value, mine.unsent, now) == counted(value, raw, now)
    assert (mine.unsent_requests, mine.unsent_tokens) == (sum(o.requests for o in raw), sum(o.tokens for o in raw))


async def test_a_lease_half_spent_while_its_renewal_is_on_the_way_waits_for_it_not_writing_again(nc):
    """Requests one after another on a roomy key, each letting the loop run (the background
    writes go on beside them, as in a router): the lease asked grows with the pace, so writes
    are a few, not one every few requests (a write queued behind each on its way, asking only
    what came meanwhile); every request reaches KV."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    scope = [("key.p", "key 'p'", ROOMY)]
    assert (await quota.admit(scope, NOW, reserve=50)).ok
    first = (await kv.get("key.p")).revision
    for i in range(2000):
        assert (await quota.admit(scope, NOW + i / 10_000, reserve=50)).ok
        await asyncio.sleep(0)
        await quota.finish(scope, 20, NOW + i / 10_000, reserve=50)
    await quota.finish(scope, 20, NOW + 0.2, reserve=50)
    value = await _written(quota, kv, "key.p")
    writes = (await kv.get("key.p")).revision - first
    print(f"\n2,000 requests one after another, the loop let run between: {writes} writes")
    assert writes < 2000 / 100  # 9 here; 114 when each write queued another behind it
    assert value["m"][1] == 2001 and value["d"][1] == 2001 * 20 and not value.get("c")


async def test_what_came_while_a_write_was_on_its_way_is_written_though_the_next_write_takes_nothing(nc):
    """A lease half spent while its renewal is on its way leaves what comes meanwhile to the
    flush timer; a change refused on KV in that time (it starts the next write at once, taking
    the timer's place) writes nothing: what the lease admitted still reaches KV soon after."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(kv, "router-a")
    quota.flush_s = 0.2
    scope = [("key.g", "key 'g'", ROOMY)]
    assert (await quota.admit(scope, NOW, reserve=50)).ok  # the first write takes the lease
    admitted = 1
    while "key.g" not in quota.writing:  # from the lease, until half of it is spent
        assert (await quota.admit(scope, NOW, reserve=50)).ok
        assert quota.finish_leased(scope, 0, NOW, reserve=50) == []
        admitted += 1
    await asyncio.sleep(0)  # the write takes its batch and is on its way
    assert "key.g" not in quota.waiting
    assert (await quota.admit(scope, NOW, reserve=50)).ok  # half spent, its renewal on its way: the timer's
    assert "key.g" in quota.soon
    refused = await quota._change("key.g", Op(at=NOW, requests=1), lambda _: Verdict(ok=False, limit="full"))
    assert not refused.ok
    value = await _written(quota, kv, "key.g")
    assert value["m"][1] == admitted + 1 and "key.g" not in quota.dirty


class _LateAnswers:
    """Real KV whose next `late` writes are held and their answers never come: nats-py's timeout
    is raised (as a router waits no longer), or `error` once the write landed; `hold`, where
    set, keeps each on its way until it is set. The test lands a held write (`land`) when it
    chooses, or never."""

    def __init__(self, kv) -> None:
        self.kv, self.late, self.held = kv, 0, None
        self.error: Exception | None = None
        self.hold: asyncio.Event | None = None

    def __getattr__(self, name):
        return getattr(self.kv, name)

    async def update(self, key, value, last=None):
        if not self.late:
            return await self.kv.update(key, value, last=last)
        self.late -= 1
        self.held = (key, value, last)
        if self.error is not None:
            assert await self.land()
            raise self.error
        if self.hold is not None:
            await self.hold.wait()
        raise NatsTimeoutError

    async def land(self) -> bool:
        """The held write reaches KV now: whether it landed (its revision still the entry's)."""
        key, value, last = self.held
        try:
            await self.kv.update(key, value, last=last)
            return True
        except KeyWrongLastSequenceError:
            return False


async def _doubting(nc, monkeypatch, leased: bool):
    """A router (`quota`) on `_LateAnswers` over real KV, with a key of 6 requests a minute
    (`scope`), its retries and background writes left to the test."""
    monkeypatch.setattr(counting, "RETRY_S", 60.0)
    bucket = await kv_bucket(nc.jetstream(), BUCKETS["limits"], ttl=3600)
    quota = Quota(_LateAnswers(bucket), "router-a")
    quota.flush_s = quota.lease_s = 60.0  # a lease spent for 30 s, written when the test says
    # A minute of one token leases nothing: each request is judged on KV.
    limits = Limits(requests_per_minute=6) if leased else Limits(requests_per_minute=6, tokens_per_minute=1)
    return bucket, quota, [("key.t", "key 't'", limits)]


async def _admit_in_doubt(quota, scope, leased: bool, at: float) -> None:
    """A request admitted whose change goes in a write whose answer never comes."""
    assert (await quota.admit(scope, at)).ok  # judged on KV: its write is the late one
    if leased:
        await quota.refresh(at)  # the write carrying what the lease admitted is the late one
    assert quota.mine["key.t"].doubts and quota.kv.held


@pytest.mark.parametrize("leased", [True, False], ids=["leased", "judged-on-kv"])
@pytest.mark.parametrize(
    ("lands", "other"),
    [("before", False), ("before", True), ("after", False), ("never", True), ("with an error", False)],
    ids=[
        "landed-before-the-retry",
        "landed-and-another-router-wrote",
        "arrived-after-the-retry",
        "never-and-another-router-wrote",
        "landed-and-failed-otherwise",
    ],
)
async def test_a_write_whose_answer_never_came_is_counted_once_whether_it_landed_or_not(
    nc, monkeypatch, leased, lands, other
):
    """A change whose write's answer never came is counted here and written again; where that
    write had in fact landed (another router writing after it keeps its stamp; or the write
    failed otherwise on its way), its changes count once, not twice (the limit was stricter
    than set: a minute of 6 refused its 6th request); where it never lands, they count all the
    same. The change in doubt is one admitted from a lease (the write carried it from before)
    or one judged on KV (the write let it in)."""
    bucket, quota, scope = await _doubting(nc, monkeypatch, leased)
    kv = quota.kv
    assert (await quota.admit(scope, NOW)).ok
    kv.late, kv.error = 1, RuntimeError("the connection broke") if lands == "with an error" else None
    await _admit_in_doubt(quota, scope, leased, NOW + 1)
    if lands == "before":
        assert await kv.land()
    if lands == "before" and not other:
        assert (await quota.read("key.t", NOW + 1)).minute_requests == 2  # a read settles it: not 3
    if other:
        assert (await Quota(bucket, "router-b").admit(scope, NOW + 1)).ok
    await quota.refresh(NOW + 2)  # the retry
    if lands == "after":
        assert not await kv.land()  # compare-and-set: the retry took its place
    value = msgspec.json.decode((await kv.get("key.t")).value)
    assert value["m"][1] == 2 + other, value
    assert [(await quota.admit(scope, NOW + 4)).ok for _ in range(5 - other)] == [True] * (4 - other) + [False]
    assert not quota.mine.get("key.t", Mine()).doubts


@pytest.mark.parametrize("leased", [True, False], ids=["leased", "judged-on-kv"])
async def test_a_read_while_a_write_is_on_its_way_leaves_a_landed_doubt_to_the_next_write(nc, monkeypatch, leased):
    """A write landed unanswered; the next one, on its way, also goes unanswered; a read of the
    counts (a hook, the console) came between. The write after them reads the entry and settles
    the first, so its changes count once: they counted twice where that read was kept as the
    counts the next write starts from."""
    _, quota, scope = await _doubting(nc, monkeypatch, leased)
    kv = quota.kv
    assert (await quota.admit(scope, NOW)).ok
    kv.late = 1
    await _admit_in_doubt(quota, scope, leased, NOW + 1)
    assert await kv.land()
    kv.late, kv.hold = 1, asyncio.Event()
    on_its_way = asyncio.create_task(quota.refresh(NOW + 2))
    while "key.t" not in quota.flying:
        await asyncio.sleep(0.01)
    await quota.read("key.t", NOW + 2)
    kv.hold.set()
    await on_its_way  # its answer never came either (and it cannot land: the first did)
    await quota.refresh(NOW + 3)
    assert msgspec.json.decode((await kv.get("key.t")).value)["m"][1] == 2
    assert not quota.mine.get("key.t", Mine()).doubts


def test_a_routers_stamp_outlives_its_other_entries_in_the_others_writes():
    """Another router's write keeps a router's stamp for `STAMP_S` (a day), long past
    `stale_s`: one cut off that long still finds whether its write landed."""
    terms = Terms("router-b", stale_s=60.0, lease_s=4.0)
    value = {"s": {"router-a": [7, NOW]}, "c": {"router-a": [1, NOW]}}
    later = written(value, terms, Mine(stamp=9), [], NOW + 3600, None).value
    assert later["s"] == {"router-a": [7, NOW], "router-b": [9, NOW + 3600]} and "router-a" not in later["c"]
    gone = written(value, terms, Mine(stamp=9), [], NOW + STAMP_S + 1, None).value
    assert gone["s"] == {"router-b": [9, NOW + STAMP_S + 1]}


def test_a_landed_doubt_gives_this_router_the_lease_its_write_took():
    """Settling a write in doubt that landed: its changes are dropped as sent, and the lease is
    the one that write took (the others count it), not the one renewed from before it."""
    mine = Mine(lease=Lease(minute="m", requests=100, tokens=0, concurrent=0))
    mine.keep(Op(at=NOW, requests=30))
    carried = mine.seal()
    took = Lease(minute="m", requests=40, tokens=0, concurrent=0)
    snapshot = Snapshot(carried, Written({}, 0, 0, took, Counts(minute_requests=5)), 123.0, 7)
    mine.renew(took)
    mine.unanswered(snapshot, [Op(at=NOW, requests=1)])
    mine.keep(Op(at=NOW, requests=2))  # admitted from the lease after the write went
    mine.settle({"s": {"a": [7, NOW]}}, "a")
    assert (mine.lease, mine.until, mine.base.minute_requests) == (took, 123.0, 5)
    assert [op.requests for op in mine.unsent] == [2] and not mine.doubts


_WRITES = st.lists(
    st.one_of(
        st.tuples(st.just("keep"), st.integers(-1, 2), st.integers(0, 9)),  # admitted from a lease
        st.tuples(st.just("unanswered"), st.booleans(), st.integers(0, 3)),  # landed?, changes it let in
        st.tuples(st.just("written")),  # a write answered (written, or refused: another wrote first)
        st.tuples(st.just("read")),
        st.tuples(st.just("other")),  # another router writes the entry
    ),
    max_size=30,
)


@given(_WRITES)
def test_writes_whose_answers_never_came_count_each_change_once_however_they_end(steps):
    """Writes that time out (having landed or not), answered ones, reads and other routers'
    writes in any order, each write landing only on the revision it was judged on (as KV's
    compare-and-set does): once a last read and write are done, KV counts each change once."""
    mine, raw, kv, stamp = Mine(), [], [], 0
    entry, known = {"rev": 0, "stamp": None}, 0

    def write(ops: list, answered: bool, landed: bool = True) -> bool:
        nonlocal stamp, known
        stamp += 1
        carried = mine.seal()
        snapshot = Snapshot(carried, Written({}, 0, 0, None, Counts()), 0.0, stamp)
        lands = landed and known == entry["rev"]
        if lands:
            kv.extend([*mine.unsent[:carried], *ops])
            entry.update(rev=entry["rev"] + 1, stamp=stamp)
        if answered and lands:
            known = entry["rev"]
            mine.sent(snapshot)
        elif not answered:
            mine.unanswered(snapshot, ops)
        return lands

    def read() -> None:
        nonlocal known
        known = entry["rev"]
        mine.settle({"s": {"a": [entry["stamp"], 0]}}, "a")

    for step in steps:
        if step[0] == "keep":
            op = Op(at=NOW, requests=step[1], tokens=step[2])
            mine.keep(op)
            raw.append(op)
        elif step[0] == "unanswered":
            ops = [Op(at=NOW, requests=1, tokens=k) for k in range(step[2])]
            raw.extend(ops)
            write(ops, answered=False, landed=step[1])
        elif step[0] == "written" and not write([], answered=True):
            read()  # refused: read, judged again
        elif step[0] == "read":
            read()
        elif step[0] == "other":
            entry["rev"] += 1
    read()
    assert write([], answered=True) and not mine.unsent and not mine.doubts
    value = {"m": [counted({}, [], NOW)["m"][0], 10, 0]}  # 10 before: a give-back never goes below 0
    assert counted(value, kv, NOW) == counted(value, raw, NOW)
