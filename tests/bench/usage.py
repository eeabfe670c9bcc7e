"""A day's usage report at 1 million and 10 million requests: from the 5-minute slots the routers
sum the usage stream into (`llmgw.router.usage.book.UsageBook.report`) against reading every request
back from the stream (`UsageBook.scan`, what reports did before the slots, without the 1,000
message stop), in the same run on the same stream.

The day: requests ending evenly over 24 hours, published as routers publish them (a message per
project and model, 80% with one request, 20% with two to four: those that ended within 20 ms),
over 20 models, 50 projects, 2,000 keys and 60 replicas drawn uniformly (every key in every slot:
the most a slot holds at these counts). They are written into JetStream within minutes, not a day,
so the stream's clock differs from the requests' times; nothing here depends on it but where a
report starts reading (the requests' own times decide their slots). Then a `UsageBook` sums the
whole stream into slots from nothing (how fast it catches up: a router keeps up with a day's
arrivals at this rate), and each report is asked for the day, from 30.5 s after its start (so its
first slot is cut and read from the stream): by model, by key, and by model in hourly buckets
(the console's day). Each report is checked equal to the scan. NATS runs without authorization
(file storage, as `llmgw up` runs it); the stream is deleted after each size. Run with
`just bench`; `python tests/bench/usage.py 1000000` for one size.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import nats
from nats.js.api import StreamConfig

from llmgw.bus import start_nats_server
from llmgw.proto import USAGE_STREAM, UsageQuery, UsageRecord
from llmgw.proto import router as router_api
from llmgw.router.usage.book import UsageBook

SIZES = (1_000_000, 10_000_000)
MODELS, PROJECTS, KEYS, REPLICAS = 20, 50, 2000, 60
ROUNDS = 3
"""Each report's time is the median of this many."""
WINDOW = 4000
"""Publishes awaiting their acknowledgement at once."""


def batches(n: int, begin: float, rng: random.Random):
    """The day's usage messages, in the order they end: (subject, data, requests in it)."""
    step, done = 86400.0 / n, 0
    while done < n:
        size = 1 if rng.random() < 0.8 else rng.randint(2, 4)
        size = min(size, n - done)
        project, model = rng.randrange(PROJECTS), rng.randrange(MODELS)
        records = [
            UsageRecord(
                request_id=f"req-{done + j:012d}",
                time=begin + (done + j) * step,
                key=f"{rng.randrange(KEYS):016x}",
                project=f"project-{project}",
                model=f"model-{model}",
                replica=f"model-{model}-cpu-{rng.randrange(REPLICAS // MODELS)}",
                status=429 if rng.random() < 0.01 else 200,
                prompt_tokens=rng.randrange(20, 2000),
                cached_tokens=rng.randrange(0, 500),
                completion_tokens=rng.randrange(1, 500),
                latency_s=1.5,
                ttft_s=0.2,
            )
            for j in range(size)
        ]
        done += size
        yield router_api.USAGE.subject(f"project-{project}", f"model-{model}"), msgspec.json.encode(records), size


async def write(js, n: int, begin: float) -> tuple[int, float]:
    """Publish a day of `n` requests; how many messages, and the seconds it took."""
    t, pending, messages = time.perf_counter(), [], 0
    for subject, data, _ in batches(n, begin, random.Random(n)):
        pending.append(await js.publish_async(subject, data))
        messages += 1
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    return messages, time.perf_counter() - t


async def catch_up(nc, js, last: int) -> tuple[UsageBook, float]:
    """A book summing the stream from nothing; the seconds until it summed message `last`."""
    book = await UsageBook.open(nc, js, 90, roll=False)
    t = time.perf_counter()
    task = asyncio.create_task(book.roll())
    while book.summed <= last:
        await asyncio.sleep(0.2)
    took = time.perf_counter() - t
    task.cancel()
    return book, took


def rows(report) -> dict:
    return {(r.start, r.group): (r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in report.rows}


async def timed(call, rounds: int) -> tuple[float, object]:
    times, got = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        got = await call()
        times.append(time.perf_counter() - t)
    return statistics.median(times), got


async def one_size(url: str, n: int) -> list[str]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=USAGE_STREAM, subjects=[router_api.USAGE.all], max_age=90 * 86400.0))
    now = time.time()
    begin = now - 86400.0
    messages, wrote = await write(js, n, begin)
    info = await js.stream_info(USAGE_STREAM)
    book, summing = await catch_up(nc, js, info.state.last_seq)
    since = begin + 30.5
    before = next(i for i in range(n) if begin + i * (86400.0 / n) >= since)  # requests before `since`
    out = [
        f"{n:,} requests in {messages:,} messages ({n / messages:.2f} a message, {info.state.bytes / 1e9:.2f} GB "
        f"in the stream); written in {wrote:.0f} s; summed into slots from nothing in {summing:.0f} s "
        f"({n / summing:,.0f} requests/s; a day of {n:,} arrives at {n / 86400:,.0f}/s)",
        f"{'report of the day':34} {'slots, s':>9} {'read':>8} {'stream, s':>10} {'read':>10} {'ratio':>7}",
    ]
    for label, query in (
        ("by model", UsageQuery(since=since, group_by="model")),
        ("by key", UsageQuery(since=since, group_by="key")),
        ("by model, hourly buckets", UsageQuery(since=since, group_by="model", bucket_s=3600)),
    ):
        fast, got = await timed(lambda q=query: book.report(q, time.time()), ROUNDS)
        read = book.read
        slow, every = await timed(lambda q=query: book.scan(q), 1)
        assert rows(got) == rows(every), f"{label}: the report from slots differs from the stream's sum"
        assert sum(r.requests for r in every.rows) == n - before, f"{label}: the scan missed requests"
        out.append(f"{label:34} {fast:9.3f} {read:8,} {slow:10.1f} {book.read:10,} {fast / slow:7.4f}")
    await js.delete_stream(USAGE_STREAM)
    await js.delete_key_value("llmgw_usage_slots")
    await nc.close()
    return out


async def main(sizes: tuple[int, ...]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="usage-bench-"))
    server = start_nats_server(folder)
    try:
        print(
            f"a day's usage report: slots (UsageBook.report) against every request read back (UsageBook.scan); "
            f"{MODELS} models, {PROJECTS} projects, {KEYS:,} keys, {REPLICAS} replicas; median of {ROUNDS} "
            "(the scan: one); 'read': stream messages a report read"
        )
        for n in sizes:
            for line in await one_size(server.url, n):
                print(line, flush=True)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(tuple(int(a) for a in sys.argv[1:]) or SIZES))
