"""The floods a hostile probe sent the router's port (issue 31), sent to llmgw's router and to its
peers in the same run, each in front of the same real llama-server (a tiny model): slow heads,
slow bodies, more connections than a process may hold, and a pipeline never read, one at a time,
each held `HOLD_S`, with a steady client beside it (one chat completion after another). Per
gateway and flood: how many of the steady client's requests were answered and how fast (p99),
how many of the flood's connections the gateway ended before the flood let go, and the gateway's
resident memory at its peak.

Each gateway runs on one core (`taskset`), as in tests/bench/gateway.py, with the descriptors
this machine allows (20,000); nginx with the bench's `worker_connections 4096` and its default
timeouts (client_header_timeout and client_body_timeout 60 s). A peer that cannot be installed
or does not start is a row saying why.

    python tests/bench/floods.py            # every gateway
    python tests/bench/floods.py llmgw      # the rows whose name holds "llmgw"
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from floods import Steady, flood  # tests/floods.py, on the path set above
from gateway_peers import (
    LOAD_CORE,
    Peer,
    Unavailable,
    rss,
    start_group,
    start_nginx,
    start_router,
    start_vllm_router,
    wait_ok,
)

from llmgw.bus import find_llamacpp, free_port
from llmgw.gguf import write_random_llama

HOLD_S = 30.0
FLOODS = [
    # name, kind, connections (or pipelined requests), source addresses
    ("3,000 slow heads", "heads", 3000, 4),
    ("1,000 slow bodies", "bodies", 1000, 4),
    ("20,400 connections", "idle", 20400, 40),
    ("234,780 pipelined", "pipeline", 234780, 1),
]


def start_engine(stack: contextlib.ExitStack, tmp: Path) -> str:
    """A real llama-server on a tiny random model, on the load generator's core."""
    weights = write_random_llama(tmp / "m.gguf")
    port = free_port()
    argv = [find_llamacpp().server, "-m", str(weights), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-c", "2048", "-np", "4", "-ngl", "0", "-t", "1"]
    proc = start_group(stack, argv, LOAD_CORE, tmp / "engine.log")
    wait_ok(proc, f"http://127.0.0.1:{port}/health", tmp / "engine.log", timeout=60)
    return f"http://127.0.0.1:{port}"


def one_flood(peer: Peer, kind: str, n: int, sources: int) -> tuple[Steady, object, int]:
    """A flood and the steady client beside it; the gateway's peak resident memory meanwhile."""
    url, key = peer.url, peer.key
    port = int(url.rsplit(":", 1)[1])
    peak, done = [rss(peer)], threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            peak[0] = max(peak[0], rss(peer))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    async def run() -> tuple[Steady, object]:
        steady = Steady(url, key)
        running = asyncio.create_task(steady.run())
        tally = await asyncio.to_thread(flood, kind, port, n, HOLD_S, key=key, every_s=2.0, sources=sources)
        await asyncio.sleep(2.0)  # and once it let go
        steady.stop()
        await running
        return steady, tally

    steady, tally = asyncio.run(run())
    done.set()
    sampler.join()
    return steady, tally, peak[0]


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    rows: list[str] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="llmgw-floods-") as d:
        tmp = Path(d)
        engine = start_engine(stack, tmp)
        peers = {
            "llmgw": lambda: start_router(stack, tmp / "llmgw", engine),
            "nginx": lambda: start_nginx(stack, tmp / "nginx", engine),
            "vllm-router": lambda: start_vllm_router(stack, tmp / "vllm-router", engine),
        }
        for name, start in peers.items():
            if only and only not in name:
                continue
            try:
                peer = start()
            except (Unavailable, subprocess.SubprocessError) as exc:
                rows.append(f"| {name} | – | did not start: {exc} | | | |")
                continue
            for label, kind, n, sources in FLOODS:
                started = time.monotonic()
                steady, tally, peak = one_flood(peer, kind, n, sources)
                answered = len(steady.answers) - len(steady.failed())
                held = "–" if kind == "pipeline" else f"{tally.made - tally.ended:,} of {tally.made:,}"
                rows.append(
                    f"| {name} | {label} | {answered} of {len(steady.answers)} | {steady.p99_ms():.0f} "
                    f"| {held} | {peak / 2**20:.0f} |"
                )
                print(rows[-1], f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    print(f"Floods held {HOLD_S:.0f} s each, one at a time, a steady client beside each (python tests/bench/floods.py)")
    print()
    print("| gateway | flood | steady client answered | its p99 ms | flood connections held to the end | RSS peak MB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
