"""KvTable follows a real JetStream KV bucket, and a bad value does not stop it."""

import asyncio

import msgspec

from llmgw.bus import KvTable, any_change
from llmgw.proto import KeyRecord


async def _until(check, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_the_table_follows_puts_and_deletes_and_leaves_out_what_does_not_decode(nc):
    js = nc.jetstream()
    table = await KvTable.open(js, "test_table", KeyRecord)
    try:
        await _until(lambda: table.synced)
        await table.kv.put("a", msgspec.json.encode(KeyRecord(name="a", created=1.0)))
        await table.kv.put("bad", b'{"name": 5}')
        await table.kv.put("b", msgspec.json.encode(KeyRecord(name="b", created=2.0)))
        await _until(lambda: "b" in table.items)
        assert set(table.items) == {"a", "b"}
        await table.kv.delete("a")
        await _until(lambda: "a" not in table.items)
    finally:
        table.stop()


def test_a_derived_index_is_built_again_only_after_a_change():
    from llmgw.bus import KvTable

    table = KvTable(kv=None, bucket="b", kind=dict)
    built = []

    def index(items):
        built.append(1)
        return sorted(items)

    table.items["x"] = {}
    assert table.derived(index) == ["x"] and table.derived(index) == ["x"] and len(built) == 1
    table.items["a"] = {}
    table.version += 1  # what the watch does on every change
    assert table.derived(index) == ["a", "x"] and len(built) == 2


async def test_a_scan_reads_every_entry_with_its_revision_and_leaves_out_what_does_not_decode(nc):
    from llmgw.bus import kv_bucket, kv_scan

    kv = await kv_bucket(nc.jetstream(), "test_scan")
    assert await kv_scan(kv, KeyRecord) == {}
    first = await kv.put("a", msgspec.json.encode(KeyRecord(name="a", created=1.0)))
    await kv.put("bad", b'{"name": 5}')
    await kv.put("gone", msgspec.json.encode(KeyRecord(name="gone", created=1.0)))
    await kv.delete("gone")
    assert await kv_scan(kv, KeyRecord) == {"a": (KeyRecord(name="a", created=1.0), first)}


async def test_a_value_nested_too_deep_or_not_json_is_logged_and_skipped_and_the_watch_carries_on(nc):
    from structlog.testing import capture_logs

    table = await KvTable.open(nc.jetstream(), "test_poison", KeyRecord)
    try:
        await _until(lambda: table.synced)
        with capture_logs() as logs:
            await table.kv.put("a", msgspec.json.encode(KeyRecord(name="a", created=1.0)))
            await table.kv.put("deep", b'{"name": "d", "created": 1, "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}")
            await table.kv.put("junk", b"\xff not json")
            await table.kv.put("b", msgspec.json.encode(KeyRecord(name="b", created=2.0)))
            await _until(lambda: "b" in table.items)
        assert set(table.items) == {"a", "b"}
        skipped = {e["key"]: e["error"] for e in logs if e["event"] == "undecodable KV value skipped"}
        assert set(skipped) == {"deep", "junk"} and "nested too deep" in skipped["deep"]
    finally:
        table.stop()


async def test_a_watch_that_ends_is_started_again_and_the_table_is_stale_until_it_caught_up(nc):
    from structlog.testing import capture_logs

    table = await KvTable.open(nc.jetstream(), "test_restart", KeyRecord)
    try:
        await _until(lambda: table.synced)
        await table.kv.put("a", msgspec.json.encode(KeyRecord(name="a", created=1.0)))
        await _until(lambda: "a" in table.items)
        with capture_logs() as logs:
            await table._watcher.stop()  # its consumer gone: the watch ends
            await _until(lambda: table.stale)
            await table.kv.delete("a")  # while no watch runs
            await table.kv.put("b", msgspec.json.encode(KeyRecord(name="b", created=2.0)))
            await _until(lambda: not table.stale)
        assert set(table.items) == {"b"} and table.restarts == 1
        assert [e["bucket"] for e in logs if e["event"] == "KV watch ended; watching again"] == ["test_restart"]
    finally:
        table.stop()


async def test_a_scan_right_after_a_write_always_holds_it(nc):
    """A list answered right after a put holds what was put (nats-py's `keys()` watches the bucket
    and can end before an entry written just before it is delivered: a catalog listing then
    missed a model the console had just served)."""
    from llmgw.bus import kv_bucket, kv_scan

    kv = await kv_bucket(nc.jetstream(), "test_scan_after")
    for i in range(150):
        await kv.put(f"k{i}", msgspec.json.encode(KeyRecord(name=f"k{i}", created=1.0)))
        assert len(await kv_scan(kv, KeyRecord)) == i + 1, f"the scan after put {i + 1} missed entries"


async def test_every_waiter_hears_the_next_change_and_one_that_gave_up_takes_it_from_no_one(nc):
    table = await KvTable.open(nc.jetstream(), "test_news", KeyRecord)
    try:
        await _until(lambda: table.synced)
        seen = table.version
        impatient = asyncio.create_task(asyncio.wait_for(any_change([table], seen), 0.05))
        waiters = [asyncio.create_task(any_change([table], seen)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert impatient.done() and isinstance(impatient.exception(), TimeoutError)
        assert not any(w.done() for w in waiters)
        await table.kv.put("a", msgspec.json.encode(KeyRecord(name="a", created=1.0)))
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert "a" in table.items  # the change is in the table when its waiters hear it
    finally:
        table.stop()


async def test_a_watch_without_nats_pys_idle_flow_control_task_still_takes_a_large_bucket_whole(nc, monkeypatch):
    """nats-py's task that would send a watch's put-off flow-control answers (waking four times a
    second, for every table) is stopped; a bucket far larger than the server sends unanswered, read
    slower than it comes, still comes whole, at first and while watched: the server asked, and
    each ask was answered on arrival."""
    import time

    from nats.aio.client import Client

    from llmgw.bus import kv_bucket

    asks, control = [], Client._is_control_message
    monkeypatch.setattr(Client, "_is_control_message", lambda c, d, h: asks.append(control(c, d, h)) or asks[-1])
    apply = KvTable._apply
    monkeypatch.setattr(KvTable, "_apply", lambda table, items, entry: (time.sleep(0.002), apply(table, items, entry)))
    kv = await kv_bucket(nc.jetstream(), "test_flow", history=1)
    big = msgspec.json.encode(KeyRecord(name="x" * 60_000, created=1.0))
    for i in range(300):  # 18 MB
        await kv.put(f"before{i}", big)
    table = await KvTable.open(nc.jetstream(), "test_flow", KeyRecord)
    try:
        await _until(lambda: table.synced and len(table.items) == 300, timeout=60)
        assert table._watcher._sub._sub._jsi._fctask.done()  # nats-py's task, stopped
        for i in range(300):
            await kv.put(f"after{i}", big)
        await _until(lambda: len(table.items) == 600, timeout=60)
        assert "FlowControl Request" in asks, "the server never asked: this test tests nothing"
    finally:
        table.stop()


async def test_any_change_returns_at_once_on_a_change_already_seen_else_at_the_next_or_the_timeout(nc):
    from llmgw.bus import any_change

    a = await KvTable.open(nc.jetstream(), "test_any_a", KeyRecord)
    b = await KvTable.open(nc.jetstream(), "test_any_b", KeyRecord)
    try:
        await _until(lambda: a.synced and b.synced)
        seen = a.version + b.version
        await asyncio.wait_for(any_change([a, b], seen - 1), 1)  # already other than seen
        waiting = asyncio.create_task(any_change([a, b], seen))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await b.kv.put("k", msgspec.json.encode(KeyRecord(name="k", created=1.0)))
        await asyncio.wait_for(waiting, 5)
        assert "k" in b.items
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(any_change([a, b], a.version + b.version, timeout=0.1), 5)  # no change: the timeout
        assert loop.time() - began >= 0.09
    finally:
        a.stop()
        b.stop()
