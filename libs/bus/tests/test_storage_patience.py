"""Making a stream, bucket or object store waits out a nats-server slow to answer (a loaded
machine, a disk slow to sync) instead of failing the service's start: frozen with SIGSTOP for
longer than JetStream's request timeout, then let go, the server still gets each one made."""

import asyncio
import os
import signal
from pathlib import Path

from llmgw.bus import event_stream, kv_bucket, obs_bucket


def _stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped."""
    threads = Path(f"/proc/{pid}/task").iterdir()
    return all((t / "stat").read_text().rpartition(")")[2].split()[0] == "T" for t in threads)


async def _frozen_while(nats_server, made, seconds=1.3):
    """Run `made` with the server frozen for `seconds` (several JetStream timeouts), then thawed.
    It is asked only once every thread has stopped: a thread in the kernel (writing to a disk the
    machine keeps busy) stops only on its way back, and the server answered before then."""
    pid = nats_server.server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(3000):
            if _stopped(pid):
                break
            await asyncio.sleep(0.01)
        task = asyncio.ensure_future(made)
        await asyncio.sleep(seconds)
        assert not task.done(), f"ended while the server was frozen: {task.exception() or task.result()!r}"
    finally:
        os.kill(pid, signal.SIGCONT)
    return await asyncio.wait_for(task, 30)


async def test_a_stream_is_made_once_a_frozen_server_answers(nats_server, nc):
    impatient = nc.jetstream(timeout=0.4)  # for the making only; what is made is read as usual
    assert await _frozen_while(nats_server, event_stream(impatient, "llmgw_slow", ["slow.>"], days=1.0))
    info = await nc.jetstream().stream_info("llmgw_slow")
    assert info.config.subjects == ["slow.>"] and info.config.max_age == 86400.0


async def test_a_bucket_and_an_object_store_are_made_once_a_frozen_server_answers(nats_server, nc):
    impatient, js = nc.jetstream(timeout=0.4), nc.jetstream()
    await _frozen_while(nats_server, kv_bucket(impatient, "slow_kv", history=3))
    kv = await js.key_value("slow_kv")
    await kv.put("a", b"1")
    assert (await kv.get("a")).value == b"1" and (await kv.status()).history == 3
    await _frozen_while(nats_server, obs_bucket(impatient, "slow_obs"))
    store = await js.object_store("slow_obs")
    await store.put("f", b"bytes")
    assert (await store.get("f")).data == b"bytes"
