"""Prefix affinity against round-robin, on real llama-servers: a shared-prefix workload (16 long
"documents", questions about them in random order, 4 at a time) over 3 replicas (goal: prompt
tokens served from cache within 90% of the best assignment, no replica over 1.25x the mean load).

Three runs, each on freshly started replicas (empty caches), the same requests in the same order:
  round-robin  the client cycles through the replicas itself;
  llmgw        through the router (prefix affinity, least outstanding);
  best         each document always to the same replica (what affinity can at most achieve).
Cached tokens are the engines' own counts (`usage.prompt_tokens_details.cached_tokens`). Run
with `just bench`.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from gateway import start_router, wait_http

from llmgw.bus import EngineKeys, find_llamacpp, free_port

REPLICAS, DOCUMENTS, REQUESTS, CONCURRENCY = 3, 16, 144, 4


def engines(weights: Path, n: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for i in range(n):
        port = free_port()
        procs.append(
            subprocess.Popen(
                [
                    find_llamacpp().server,
                    "-m",
                    str(weights),
                    "-c",
                    "8192",
                    "-np",
                    "2",
                    "-ngl",
                    "0",
                    "--threads",
                    "1",
                    "--port",
                    str(port),
                    "--api-key",
                    engine_key(i),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(f"{url}/health")
        while httpx.get(f"{url}/health").status_code != 200:
            time.sleep(0.2)
    return procs, urls


def engine_key(i: int) -> str:
    """The key of replica r<i>, as the bench's router (no engine secret) works it out."""
    return EngineKeys(b"").key("n", f"r{i}")


def workload() -> list[tuple[int, list[dict]]]:
    rng = random.Random(3)
    docs = [
        " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma"]) for _ in range(300))
        for _ in range(DOCUMENTS)
    ]
    out = []
    for i in range(REQUESTS):
        d = rng.randrange(DOCUMENTS)
        out.append(
            (
                d,
                [
                    {"role": "system", "content": f"Document {d}: {docs[d]}"},
                    {"role": "user", "content": f"Question {i}: what does it say?"},
                ],
            )
        )
    return out


async def run(requests, target) -> tuple[list[int], list[float], Counter]:
    """Send the requests, CONCURRENCY at a time; `target(i, doc)` gives (url, key) of each."""
    cached, ttfts, served = [0] * len(requests), [0.0] * len(requests), Counter()
    todo = iter(range(len(requests)))
    async with httpx.AsyncClient(timeout=120) as http:

        async def worker():
            for i in todo:
                doc, messages = requests[i]
                url, key = target(i, doc)
                t = time.perf_counter()
                r = await http.post(
                    url,
                    json={"model": "m", "messages": messages, "max_tokens": 1},
                    headers={"authorization": f"Bearer {key}"},
                )
                ttfts[i] = time.perf_counter() - t  # one token: the whole answer is its first
                body = r.json()
                cached[i] = ((body.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                served[r.headers.get("x-llmgw-replica") or url] += 1

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return cached, ttfts, served


def main() -> None:
    from llmgw.gguf import write_random_llama

    tmp = Path(tempfile.mkdtemp(prefix="llmgw-routing-"))
    weights = write_random_llama(tmp / "m.gguf")
    requests = workload()
    rows = {}
    try:
        for mode in ("round-robin", "llmgw", "best"):
            procs, urls = engines(weights, REPLICAS)
            router = nats = None
            try:
                if mode == "llmgw":
                    router, url, key, nats = start_router(tmp / mode, urls)
                    rows[mode] = asyncio.run(run(requests, lambda i, d, url=url, key=key: (url, key)))
                else:

                    def pick(i, d, urls=urls, mode=mode):
                        chosen = i % REPLICAS if mode == "round-robin" else d % REPLICAS
                        return f"{urls[chosen]}/v1/chat/completions", engine_key(chosen)

                    rows[mode] = asyncio.run(run(requests, pick))
            finally:
                for p in procs + ([router] if router else []):
                    p.terminate()
                    p.wait()
                if nats:
                    nats.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = sum(rows["best"][0])
    print(
        f"{REQUESTS} chat requests over {DOCUMENTS} shared documents (~1,800 tokens each), {CONCURRENCY} at a time, "
        f"{REPLICAS} llama-server replicas"
    )
    print(f"{'':13}{'cached tokens':>14}{'of best':>9}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'max/mean load':>15}")
    for mode, (cached, ttfts, served) in rows.items():
        loads = list(served.values()) + [0] * (REPLICAS - len(served))
        p99 = statistics.quantiles(ttfts, n=100)[98]
        print(
            f"{mode:13}{sum(cached):14d}{sum(cached) / best:9.0%}{statistics.median(ttfts) * 1000:13.1f}"
            f"{p99 * 1000:13.1f}{max(loads) / statistics.mean(loads):15.2f}"
        )
    ours = rows["llmgw"]
    spread = max(ours[2].values()) / statistics.mean(list(ours[2].values()) + [0] * (REPLICAS - len(ours[2])))
    print(
        f"goal: cache hits within 90% of the best and no replica over 1.25x the mean load: "
        f"{'met' if sum(ours[0]) >= 0.9 * best and spread <= 1.25 else 'NOT met'}"
    )


if __name__ == "__main__":
    sys.exit(main())
