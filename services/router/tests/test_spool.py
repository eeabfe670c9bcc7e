"""Usage the stream does not take is kept on the router's disk and sent again (`spool.py`), on a
real nats-server: nothing lost while the stream is away, nothing counted twice once it is back,
what a router that died kept is sent by the next, and a full disk keeps it in memory meanwhile."""

import contextlib
import subprocess

import msgspec
from nats.js.api import StreamConfig

from llmgw.proto import USAGE_STREAM, UsageRecord
from llmgw.proto import router as router_api
from llmgw.router.usage import spool as spool_module
from llmgw.router.usage.spool import Spooled, UsageSpool, message_id


def message(*ids: str) -> Spooled:
    records = [UsageRecord(request_id=i, time=1.0, key="k", project="p", model="m") for i in ids]
    return Spooled(id=message_id(records), subject=router_api.USAGE.subject("p", "m"), records=records)


async def spool_keeping(folder, js, count: int) -> tuple[UsageSpool, list[Spooled]]:
    """A spool opened in `folder` that kept `count` messages, written to its file."""
    spool = UsageSpool(folder, js, ack_s=1.0)
    spool.open()
    kept = [message(f"r{i}") for i in range(count)]
    for m in kept:
        spool.keep(m)
    await spool.flush()
    return spool, kept


async def stream_messages(js) -> int:
    return (await js.stream_info(USAGE_STREAM)).state.messages


async def test_usage_kept_while_the_stream_is_away_is_taken_once_when_it_is_back(nc, tmp_path):
    js = nc.jetstream()
    spool = UsageSpool(tmp_path / "spool", js, ack_s=1.0)
    spool.open()
    one, two = message("r1", "r2"), message("r3")
    spool.keep(one)
    spool.keep(two)
    spool.keep(one)  # kept once
    await spool.resend()  # no stream yet: nothing taken, nothing dropped
    await spool.flush()
    (path,) = list((tmp_path / "spool").glob("*.jsonl"))
    assert set(spool.pending) == {one.id, two.id} == set(spool_module._read(path.read_bytes()))
    await js.add_stream(StreamConfig(name=USAGE_STREAM, subjects=[router_api.USAGE.all]))
    await js.publish(one.subject, msgspec.json.encode(one.records), headers={"Nats-Msg-Id": one.id})  # taken, ack lost
    await spool.resend()
    assert not spool.pending and await stream_messages(js) == 2  # one's resend deduplicated
    await spool.flush()
    assert path.stat().st_size == 0  # all taken: the file starts over
    spool.close()


async def test_what_a_stopped_router_kept_is_sent_by_the_next_and_what_it_sent_is_not(nc, tmp_path):
    js = nc.jetstream()
    first = UsageSpool(tmp_path / "spool", js, ack_s=1.0)
    first.open()
    sent, unsent, third = message("a"), message("b"), message("c")
    for m in (sent, unsent, third):
        first.keep(m)
    first._sent(sent.id)  # as resend marks it
    await first.flush()
    running = UsageSpool(tmp_path / "spool", js, ack_s=1.0)
    running.open()  # the first still runs: its file is not taken
    assert not running.pending
    first.close()
    second = UsageSpool(tmp_path / "spool", js, ack_s=1.0)
    second.open()
    assert set(second.pending) == {unsent.id, third.id}
    assert len(list((tmp_path / "spool").glob("*.jsonl"))) == 2  # the running one's and its own
    await js.add_stream(StreamConfig(name=USAGE_STREAM, subjects=[router_api.USAGE.all]))
    await second.resend()
    assert await stream_messages(js) == 2
    for spool in (running, second):
        spool.close()


async def test_a_file_mostly_of_sent_messages_is_written_anew_with_what_is_pending(nc, tmp_path):
    spool, kept = await spool_keeping(tmp_path / "spool", nc.jetstream(), 1500)
    for m in kept[:1400]:
        spool._sent(m.id)
    await spool.flush()
    (path,) = list((tmp_path / "spool").glob("*.jsonl"))
    assert spool.lines == 100 and len(path.read_bytes().splitlines()) == 100
    assert set(spool_module._read(path.read_bytes())) == {m.id for m in kept[1400:]}
    spool.close()


async def test_a_full_disk_keeps_usage_in_memory_until_it_can_write_it(nc, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        spool = UsageSpool(small / "spool", nc.jetstream(), ack_s=1.0)
        spool.open()
        with contextlib.suppress(OSError), (small / "filler").open("wb", buffering=0) as f:
            while True:
                f.write(b"x" * 4096)
        kept = [message(f"r{i}") for i in range(3)]
        for m in kept:
            spool.keep(m)
        await spool.flush()
        assert len(spool.unwritten) == 3 and spool.failing and set(spool.pending) == {m.id for m in kept}
        (path,) = list((small / "spool").glob("*.jsonl"))
        assert path.read_bytes() == b""  # nothing half written
        (small / "filler").unlink()
        spool.keep(message("after"))
        await spool.flush()
        assert not spool.unwritten and not spool.failing
        assert set(spool_module._read(path.read_bytes())) == {m.id for m in kept} | {message("after").id}
        spool.close()
    finally:
        subprocess.run(["umount", str(small)], check=False)


async def test_a_rewrite_the_disk_refused_is_tried_again_though_nothing_more_comes(nc, tmp_path, monkeypatch):
    """Every kept message sent, the file is written anew (emptied); where the disk refuses that
    (no inode left here), `run` tries again on its own, with no message kept or sent after."""
    import asyncio

    monkeypatch.setattr(spool_module, "FLUSH_S", 0.05)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16", "tmpfs", str(small)], check=True)
    spool = run = None
    try:
        spool, kept = await spool_keeping(small / "spool", nc.jetstream(), 3)
        fillers = []
        with contextlib.suppress(OSError):
            for i in range(100):
                (small / f"filler{i}").touch()
                fillers.append(small / f"filler{i}")
        for m in kept:
            spool._sent(m.id)
        run = asyncio.create_task(spool.run())
        for _ in range(200):
            await asyncio.sleep(0.02)
            if spool.failing:
                break
        assert spool.failing and spool.lines == 3  # the rewrite was refused
        for filler in fillers:
            filler.unlink()
        for _ in range(250):
            await asyncio.sleep(0.02)
            if not spool.failing:
                break
        (path,) = list((small / "spool").glob("*.jsonl"))
        assert not spool.failing and spool.lines == 0 and path.read_bytes() == b""
    finally:
        if run is not None:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        if spool is not None:
            spool.close()  # its file open would keep the tmpfs busy
        subprocess.run(["umount", str(small)], check=False)
