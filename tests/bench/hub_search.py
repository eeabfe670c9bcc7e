"""The Hugging Face screen's search against fetching: the time `catalog.hub.search` takes to show
20 GGUF files with the ways each would run here (the Hub's search, then every file's header read
by HTTP range requests, 8 at a time, then a serve plan for each), beside the time the mirror takes
to fetch one of those files (resolve, download, verify every byte).

The Hub is the stand-in (`llmgw.hubstandin`, not the Hub) on this machine, 4 repos of 5 files each
(one 107 MB Q8_0 model written with `gguf`, published under 20 names), its bytes served at
100 MB/s (`throttle`: a fast link to the Hub; the search's requests are small and few). The
mirror, the catalog and the scheduler run as users start them (`llmgw service NAME`), NATS
without authorization (a bench). Medians of 3 rounds; each fetch a new commit. Run with `just bench`.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmgw.bus import BusError, call, connect, start_nats_server
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.hubstandin import HubStandIn
from llmgw.proto import Empty, NodeInfo, RepoAdd, catalog, mirror, scheduler
from llmgw.proto.hub import HubSearch

ROUNDS = 3
REPOS, FILES = 4, 5
RATE = 100_000_000
MODEL = TinyLlama(embedding=1024, layers=8, heads=8, kv_heads=4, feed_forward=2816, tensor_type="Q8_0")


def _service(name: str, tmp: Path, nats_url: str, *more: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "llmgw.ctl", "service", name, "--nats-url", nats_url, "--admin-port", "0"]
    argv += ["--log-level", "warning", *more]
    with open(tmp / f"{name}.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log)


async def _until(nc, endpoint, message) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await call(nc, endpoint, message, timeout=2)
            return
        except BusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _fetched(nc, repo: str, commit: str) -> float:
    """Seconds from asking the mirror for one file until it is verified and served."""
    started = time.perf_counter()
    await call(nc, mirror.REPO_ADD, RepoAdd(repo=repo, revision=commit, include=["m-0.gguf"]))
    while True:
        held = [r for r in (await call(nc, mirror.REPO_LIST, Empty())).repos if r.repo == repo and r.commit == commit]
        if held and held[0].state == "ready":
            return time.perf_counter() - started
        if held and held[0].state == "failed":
            raise RuntimeError(f"the fetch failed: {held[0].error}")
        await asyncio.sleep(0.05)


async def run(tmp: Path) -> None:
    model = write_random_llama(tmp / "m.gguf", MODEL)
    size = model.stat().st_size
    with HubStandIn() as hub:
        for r in range(REPOS):
            hub.add_repo(f"bench/chat-{r}-GGUF", {f"m-{i}.gguf": model for i in range(FILES)})
        hub.throttle(RATE)
        nats = start_nats_server(tmp / "nats")
        services = [
            _service(
                "mirror",
                tmp,
                nats.url,
                "--root",
                str(tmp / "mirror"),
                "--hub-endpoint",
                hub.url,
                "--data-dir",
                str(tmp / "home"),
                "--keep-free-bytes",
                "0",
            ),
            _service("catalog", tmp, nats.url),
            _service("scheduler", tmp, nats.url),
        ]
        try:
            nc = await connect(nats.url, "bench-hub")
            await _until(nc, mirror.REPO_LIST, Empty())
            await _until(nc, scheduler.NODE_LIST, Empty())
            node = NodeInfo(
                node="here",
                hostname="here",
                cpus=2,
                memory_total_mb=8192,
                memory_available_mb=8192,
                engines={"llamacpp": "bench"},
                membw_all_gbs=20.0,
                membw_one_gbs=15.0,
            )
            await call(nc, scheduler.NODE_REGISTER, node)
            searches, fetches, read = [], [], 0
            for round_ in range(ROUNDS):
                started = time.perf_counter()
                ways = await call(nc, catalog.HUB_SEARCH, HubSearch(text="chat", limit=REPOS, files=20), timeout=120)
                searches.append(time.perf_counter() - started)
                files = [f for m in ways.found.models for f in m.files]
                assert len(files) == REPOS * FILES and all(f.facts for f in files), "a header did not read"
                assert all(ways.plans[f.source].ways for f in files), "a file has no way"
                read = ways.found.bytes_read
                commit = hub.add_repo("bench/fetched", {"m-0.gguf": model, "round": str(round_).encode()})
                fetches.append(await _fetched(nc, "bench/fetched", commit))
            await nc.close()
        finally:
            for p in services:
                p.terminate()
                p.wait(10)
            nats.stop()
    search, fetch = statistics.median(searches), statistics.median(fetches)
    print(
        f"{REPOS * FILES} files of {size / 1e6:.0f} MB on the Hub stand-in, its bytes at {RATE / 1e6:.0f} MB/s; "
        f"medians of {ROUNDS}"
    )
    rows = [
        ("", "seconds", "bytes from the Hub"),
        (f"search: {REPOS * FILES} files' headers read and planned", f"{search:.2f}", f"{read / 1e6:.1f} MB"),
        ("fetch one file (download, verify)", f"{fetch:.2f}", f"{size / 1e6:.0f} MB"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print(f"the search took {search / fetch:.0%} of one fetch's time and {read / size:.1%} of one file's bytes")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))


if __name__ == "__main__":
    main()
