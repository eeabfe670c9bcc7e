"""Usage reports on a real nats-server and a real router (no engines: the records are published
the way routers publish them): every record in the window is counted, however many messages the
stream holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import msgspec
import pytest

from llmgw.bus import kv_keys
from llmgw.proto import USAGE_STREAM, UsageQuery, UsageRecord
from llmgw.proto import router as router_api
from llmgw.router.service import Router, RouterConfig

PROJECTS = ("alpha", "beta", "gamma")


def _batch(i: int, at: float) -> list[UsageRecord]:
    """The records of message `i`: one, or three where routers batched requests that ended together."""
    return [
        UsageRecord(
            request_id=f"r{i}.{j}",
            time=at,
            key=f"{i % 7:016x}",
            project=PROJECTS[i % 3],
            tenant=("default", "research")[i % 2],
            model="m",
            status=500 if i % 11 == 0 else 200,
            prompt_tokens=10,
            completion_tokens=j + 1,
        )
        for j in range(3 if i % 4 == 0 else 1)
    ]


async def _publish(nc, batches: list[list[UsageRecord]]) -> None:
    """Publish each batch as one usage message, as a router does, and wait for the stream to keep them all."""
    js = nc.jetstream()
    before = (await js.stream_info(USAGE_STREAM)).state.messages
    acks = [
        await js.publish_async(router_api.USAGE.subject(b[0].project, b[0].model), msgspec.json.encode(b))
        for b in batches
    ]
    await asyncio.gather(*acks)
    assert (await js.stream_info(USAGE_STREAM)).state.messages == before + len(batches)


@pytest.fixture
async def router(serve):
    config = RouterConfig(http_port=0, usage_summing="inline")  # its `accounts.book` sums
    return await serve(Router(config), config)


async def test_a_usage_report_counts_every_record_past_a_thousand_messages(router, nc, nats_server):
    """1,600 messages holding 2,400 records: the report (in the router, and through `llmgw ctl
    usage`) counts all of them, not the 1,000 messages a consumer that acks nothing stops at."""
    now = time.time()
    batches = [_batch(i, now) for i in range(1600)]
    await _publish(nc, batches)
    records = [r for b in batches for r in b]
    want = {p: sum(r.project == p for r in records) for p in PROJECTS}
    assert sum(want.values()) == 2400

    rows = (await router.accounts.sum_usage(UsageQuery(since=now - 60, group_by="project"))).rows
    assert {r.group: r.requests for r in rows} == want
    assert sum(r.completion_tokens for r in rows) == sum(r.completion_tokens for r in records)
    assert sum(r.errors for r in rows) == sum(r.status >= 400 for r in records)

    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    asked = [*ctl, "usage", "--json", "--by", "project", "--since-hours", "1"]
    done = await asyncio.to_thread(subprocess.run, asked, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {r["group"]: r["requests"] for r in json.loads(done.stdout)["rows"]} == want


async def _caught_up(*books, timeout: float = 60.0) -> None:
    """Wait until every book's summing has read the whole stream."""
    deadline = time.monotonic() + timeout
    while True:
        last = (await books[0].js.stream_info(USAGE_STREAM)).state.last_seq
        if all(b.summed > last for b in books):
            return
        assert time.monotonic() < deadline, f"summing never reached message {last}"
        await asyncio.sleep(0.1)


def _plain(records: list[UsageRecord], since: float, group_by: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in records:
        if r.time >= since:
            row = out.setdefault(getattr(r, group_by), [0, 0, 0])
            row[0] += 1
            row[1] += r.status >= 400
            row[2] += r.completion_tokens
    return out


def _table(report) -> dict:
    return {(r.start, r.group): (r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in report.rows}


async def test_reports_from_slots_equal_the_stream_summed_one_by_one_as_two_routers_sum_it(serve, nc):
    """Two routers sum the stream into 5-minute slots (one stopped halfway and started again); an
    hour of requests, some late for their slot: every report (from slots and the stream after
    them) equals the stream summed request by request, and reads little of it."""
    from llmgw.proto.router import USAGE_SLOT_S
    from llmgw.router.usage.book import UsageBook

    config = RouterConfig(http_port=0, usage_summing="inline")
    a = await serve(Router(config), config)
    b = await serve(Router(msgspec.structs.replace(config)), config)
    now = time.time()
    start = (now // USAGE_SLOT_S - 12) * USAGE_SLOT_S  # an hour back, on a slot
    batches = []
    for i in range(1200):
        batch = _batch(i, start + i * 3.0)
        if i % 50 == 7:  # a router whose clock is behind, or a message held up: late for its slot
            batch.append(msgspec.structs.replace(batch[0], request_id=f"late{i}", time=start + i * 3.0 - 900))
        batches.append(batch)
    records = [r for batch in batches for r in batch]
    await _publish(nc, batches[:600])
    await _caught_up(a.accounts.book, b.accounts.book)
    b.accounts.book.stop()  # router b stops summing; starts again below from the rolled mark
    await _publish(nc, batches[600:])
    await _caught_up(a.accounts.book)
    b.accounts.book = await UsageBook.open(b.ctx.nc, b.ctx.js, 90)
    await _caught_up(a.accounts.book, b.accounts.book)

    slots = b.accounts.book.slots
    assert len(await kv_keys(slots)) > 8, "the routers wrote no slots"  # not nats-py's keys(): it races
    messages = (await nc.jetstream().stream_info(USAGE_STREAM)).state.messages
    for since in (0.0, start + 7.5, start + 3 * USAGE_SLOT_S, start + 1234.5, now - 200):
        for group_by in ("model", "project", "key", "replica", "tenant"):
            for bucket_s in (0, USAGE_SLOT_S, 3600, 60):
                query = UsageQuery(since=since, group_by=group_by, bucket_s=bucket_s)
                every = await a.accounts.book.scan(query)
                for router in (a, b):
                    got = await router.accounts.sum_usage(query)
                    assert _table(got) == _table(every), (since, group_by, bucket_s)
                if bucket_s == 0:
                    plain = {r.group: [r.requests, r.errors, r.completion_tokens] for r in every.rows}
                    assert plain == _plain(records, since, group_by)
                    read = b.accounts.book.read  # the stream after the slots, and the edge slot's
                    assert read < messages / 2, f"a report since {since} read {read} of {messages} messages"


async def test_a_slot_too_big_for_one_entry_is_split_and_still_counted_whole(router, nc):
    """12,000 keys in one slot: its sums are split over several entries, each key in one."""
    from llmgw.proto.router import USAGE_SLOT_GRACE_S, USAGE_SLOT_S

    start = (time.time() // USAGE_SLOT_S - 3) * USAGE_SLOT_S
    batches = [
        [
            UsageRecord(request_id=f"r{i}.{j}", time=start + 10 + i, key=f"{i * 200 + j:016x}", project="p", model="m")
            for j in range(200)
        ]
        for i in range(60)
    ]
    later = start + USAGE_SLOT_S + USAGE_SLOT_GRACE_S + 1
    closing = UsageRecord(request_id="c", time=later, key="k", project="p", model="m")
    await _publish(nc, [*batches, [closing]])
    await _caught_up(router.accounts.book)
    first = msgspec.json.decode((await router.accounts.book.slots.get(f"{int(start)}.key.0")).value)
    assert first["parts"] > 1
    rows = (await router.accounts.sum_usage(UsageQuery(since=start, group_by="key"))).rows
    assert len(rows) == 12_001 and all(r.requests == 1 for r in rows)
    assert router.accounts.book.read == 1  # the closing message: the slot's 12,000 come from its entries


async def test_slots_summed_before_tenants_count_as_the_default_tenants(router, nc):
    """Slots a router from before tenants summed have no entries by tenant: a report by tenant
    counts what they hold as the default tenant's (every request then was)."""
    from llmgw.proto.router import USAGE_SLOT_GRACE_S, USAGE_SLOT_S

    start = (time.time() // USAGE_SLOT_S - 3) * USAGE_SLOT_S
    old = [
        [UsageRecord(request_id=f"o{i}", time=start + 10 + i, key="k", project="p", model=f"m{i % 3}")]
        for i in range(30)
    ]
    later = start + USAGE_SLOT_S + USAGE_SLOT_GRACE_S + 1
    await _publish(nc, [*old, [UsageRecord(request_id="c", time=later, key="k", project="p", model="m0")]])
    await _caught_up(router.accounts.book)
    slots = router.accounts.book.slots
    for key in [k for k in await kv_keys(slots) if ".tenant." in k]:
        await slots.purge(key)  # as a router from before tenants left the slot
    rows = (await router.accounts.sum_usage(UsageQuery(since=start, group_by="tenant"))).rows
    assert [(r.group, r.requests) for r in rows] == [("default", 31)]
    assert router.accounts.book.read == 1  # the 30 from the slot's entries by model


async def test_summing_gives_the_loop_back_to_the_requests_being_served(router, nc):
    """A second of usage at 7,000 requests a second summed at once held the router's loop ~30 ms,
    its p99 with it: between two turns of the loop, summing takes at most `GIVE_BACK` requests
    (and one message) more."""
    from llmgw.router.accounts.accounts import USAGE_BATCH
    from llmgw.router.usage.book import GIVE_BACK

    book = router.accounts.book
    while book.roller is None:  # summing started
        await asyncio.sleep(0.05)
    now = time.time()
    batches = [
        [
            UsageRecord(request_id=f"r{i}.{j}", time=now, key="k", project="p", model="m", replica="n/m-0")
            for j in range(140)
        ]
        for i in range(50)
    ]
    steps: list[int] = []

    async def turns() -> None:  # one step a turn of the loop: the requests summed since the last
        seen = book.roller.requests
        while True:
            await asyncio.sleep(0)
            steps.append(book.roller.requests - seen)
            seen = book.roller.requests

    ticker = asyncio.create_task(turns())
    try:
        await _publish(nc, batches)
        await _caught_up(book)
    finally:
        ticker.cancel()
    assert sum(steps) == 50 * 140
    assert max(steps) <= GIVE_BACK + USAGE_BATCH, f"summing held the loop for {max(steps)} requests at once"


async def test_a_router_sums_in_a_process_of_its_own_at_idle_priority(serve, nc):
    """By default the stream is summed beside the router, not on its loop: a process that runs
    only on a core nothing else wants, writes the slots reports read, is started again when it
    dies, and ends with the router."""
    import os
    import signal

    from llmgw.proto import BUCKETS, UsageRolled
    from llmgw.proto.router import USAGE_SLOT_GRACE_S, USAGE_SLOT_S
    from llmgw.router.usage.summing import RESTART_S

    config = RouterConfig(http_port=0)
    assert config.usage_summing == "process"
    router = await serve(Router(config), config)
    summing = router.summing
    while summing.proc is None:
        await asyncio.sleep(0.05)
    first = summing.proc
    assert os.sched_getscheduler(first.pid) == os.SCHED_IDLE
    assert router.accounts.book.roller is None  # nothing summed on the router's own loop

    start = (time.time() // USAGE_SLOT_S - 3) * USAGE_SLOT_S
    batches = [_batch(i, start + 10 + i) for i in range(200)]
    closing = UsageRecord(
        request_id="c", time=start + USAGE_SLOT_S + USAGE_SLOT_GRACE_S + 1, key="k", project="p", model="m"
    )
    await _publish(nc, [*batches, [closing]])
    slots = await nc.jetstream().key_value(BUCKETS["usage_slots"])
    deadline = time.monotonic() + 60
    while True:  # the slot closed and written by the process: the rolled mark past it
        try:
            if msgspec.json.decode((await slots.get("rolled")).value, type=UsageRolled).resume > 200:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the summing process wrote no slot"
        await asyncio.sleep(0.2)
    query = UsageQuery(since=start, group_by="project")
    report = await router.accounts.sum_usage(query)
    assert router.accounts.book.read == 1  # the closing message: the slot's requests came from its sums
    assert _table(report) == _table(await router.accounts.book.scan(query))

    first.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + RESTART_S + 30
    while summing.starts < 2 or summing.proc is first:
        assert time.monotonic() < deadline, "summing was not started again"
        await asyncio.sleep(0.1)
    second = summing.proc
    await router.stop()
    assert await asyncio.wait_for(second.wait(), 10) is not None


async def test_summing_carries_on_after_nats_stops_and_starts_again(router, nc, nats_server):
    """NATS stopped and started again (the consumer summing read through, in memory, gone with
    it): the router sums on from the rolled mark, and a report still counts every request."""
    from llmgw.proto.router import USAGE_SLOT_S

    start = (time.time() // USAGE_SLOT_S - 6) * USAGE_SLOT_S
    batches = [_batch(i, start + i * 1.0) for i in range(1500)]  # 25 minutes of requests
    await _publish(nc, batches[:700])
    await _caught_up(router.accounts.book)
    nats_server.stop()
    nats_server.restart()
    deadline = time.monotonic() + 30
    while True:  # connected again, and JetStream answering (it recovers its streams first)
        assert time.monotonic() < deadline, "NATS never came back"
        if nc.is_connected and router.ctx.nc.is_connected:
            try:
                await nc.jetstream().stream_info(USAGE_STREAM)
                break
            except Exception:
                pass
        await asyncio.sleep(0.1)
    await _publish(nc, batches[700:])
    await _caught_up(router.accounts.book, timeout=90)
    query = UsageQuery(since=start + 100.5, group_by="key")
    assert _table(await router.accounts.sum_usage(query)) == _table(await router.accounts.book.scan(query))
    assert sum(r.requests for r in (await router.accounts.sum_usage(UsageQuery(since=start))).rows) == sum(
        len(b) for b in batches
    )


async def test_llmgw_ctl_usage_by_key_gets_a_hundred_thousand_rows_in_pages(router, nc, nats_server):
    """100,000 keys' usage: a report by key is ~11 MB of rows, more than a NATS message takes
    (once: MaxPayloadError); `llmgw ctl usage --by key` gets every row in pages, biggest first,
    and a caller from before pages asking for it whole is told to ask in pages."""
    from llmgw.bus import request_raw

    now, n = time.time(), 100_000
    keys = [f"{i:016x}" for i in range(n)]
    batches = [
        [
            UsageRecord(
                request_id=f"r{k}", time=now - 30, key=k, project="p", model="m", completion_tokens=int(k, 16) % 97
            )
            for k in keys[i : i + 200]
        ]
        for i in range(0, n, 200)
    ]
    await _publish(nc, batches)

    whole = UsageQuery(since=now - 3600, group_by="key")
    refused = await request_raw(nc, router_api.USAGE_SUM.subject(), msgspec.json.encode(whole), timeout=60)
    assert (refused.headers or {}).get("Nats-Service-Error-Code") == "400"
    assert "ask for them in pages" in refused.headers["Nats-Service-Error"]

    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    asked = [*ctl, "usage", "--json", "--by", "key", "--since-hours", "1"]
    done = await asyncio.to_thread(subprocess.run, asked, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    assert sorted(r["group"] for r in rows) == keys and all(r["requests"] == 1 for r in rows)
    assert [r["completion_tokens"] for r in rows] == sorted((int(k, 16) % 97 for k in keys), reverse=True)


async def test_the_request_log_pages_back_through_the_stream_newest_first_filtered(router, nc, nats_server):
    """The request log (one operation: NATS, the admin API, `llmgw ctl requests`, the console)
    reads the stream's end backwards: newest first, whole messages a page, each page starting
    where the last stopped, filters by model, key and errors; nothing of a prompt."""
    from llmgw.proto import RequestLogAsk

    now = time.time()
    batches = [_batch(i, now - 1000 + i) for i in range(1200)]  # message i ends at now-1000+i
    await _publish(nc, batches)
    records = [r for b in batches for r in b]
    seen, before = [], 0
    while True:  # the whole log, page by page
        page = await router.accounts.request_log(RequestLogAsk(limit=500, before=before))
        seen += page.requests
        if not page.next:
            break
        before = page.next
    assert sorted(r.request_id for r in seen) == sorted(r.request_id for r in records)
    assert [r.time for r in seen] == sorted((r.time for r in records), reverse=True)
    first = await router.accounts.request_log(RequestLogAsk(limit=5))
    assert first.requests[0].request_id == records[-1].request_id and len(first.requests) >= 5
    errors = await router.accounts.request_log(RequestLogAsk(limit=20, errors=True, key=f"{0:016x}"))
    assert errors.requests and all(r.status == 500 and r.key == f"{0:016x}" for r in errors.requests)
    assert [r.time for r in errors.requests] == sorted((r.time for r in errors.requests), reverse=True)

    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    done = await asyncio.to_thread(
        subprocess.run, [*ctl, "requests", "--limit", "3"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["TIME", "(UTC)", "KEY", "MODEL"] and lines[-1].startswith("older: --before ")
    bad = await asyncio.to_thread(
        subprocess.run, [*ctl, "requests", "--key", "nope"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "key" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


async def test_the_request_log_of_an_empty_stream_is_empty_with_nothing_older(router):
    """An empty stream says its first sequence is 0: the log once answered "older: before 1"
    there, and a reader following it asked for ever."""
    from llmgw.proto import RequestLogAsk

    for before in (0, 1, 5):
        page = await router.accounts.request_log(RequestLogAsk(before=before))
        assert (page.requests, page.next) == ([], 0)
