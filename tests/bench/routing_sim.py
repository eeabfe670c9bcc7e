"""Cache-aware routing on modelled engines (issue 42): the router's own `Balancer` beside the best
assignment and round-robin on `routing.py`'s three workloads, each over many arrival seeds, so a
change of routing policy is judged without the shared machine's noise (`routing.py`'s own rows
on the real model vary by hundreds of milliseconds from run to run).

A modelled engine is a stand-in for llama-server, not a measurement of it:
- it serves its requests in arrival order, one at a time: reading a prompt costs `READ_MS` for
  each token it does not hold, and every request `ANSWER_MS` more (its one token, the HTTP);
  its timing (llama-server's `prompt_ms`, which holds a fixed part of about that size; its
  `predicted_ms` for one token is 0) is the time it took, shared cores and all;
- the engines share the machine's `CORES`: while k of them are busy each runs at min(1, CORES/k);
- it holds the prompts it read most recently, `CACHE_TOKENS` in all (llama-server's slots and its
  `--cache-ram`); a prompt's cached tokens are the longest prefix it shares with one of them, and
  it takes that one's place where it shares at least half of it (a slot reusing its cache, as
  llama-server's `--slot-prompt-similarity` 0.5), else the place of the oldest.
A prompt's tokens are its characters over `CHARS_PER_TOKEN`. The balancer hears of each request
as the router's shell tells it (`pick`, `started`, `finished`, `served` with the engine's cached
tokens). Figures: over the seeds, the median of each policy's TTFT p50 and p99, its cached
tokens against the best assignment's, and on how many seeds llmgw's p50 is within 10% of it.

    python tests/bench/routing_sim.py            # --seeds N (default 20)
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, field

from routing import RATE, REPLICAS, multi_turn, workload

from llmgw.proto import Model
from llmgw.router.request.core import check_request
from llmgw.router.routing.balance import Balancer, Candidate

__all__ = ["main", "simulate"]

READ_MS, ANSWER_MS, CORES = 8.0, 80.0, 2
"""Chosen so the model's rows land near `routing.py`'s real ones on this machine (round-robin's
documents p50 about 1.5 s, the best assignment's a few hundred milliseconds)."""
CACHE_TOKENS, CHARS_PER_TOKEN, SLOTS = 1000, 5.0, 2
"""About six documents' prompts (`routing.py`'s --cache-ram 24 MiB and two slots)."""
STEP_MS = 1.0
MODEL = Model(name="m", source="hf://bench/smollm2/m.gguf")


@dataclass
class _Engine:
    """One modelled engine: its queue, what it works on, and the prompts it holds (oldest first)."""

    queue: list[int] = field(default_factory=list)
    busy: int | None = None
    left_ms: float = 0.0
    began_ms: float = 0.0
    held: list[str] = field(default_factory=list)

    def take(self, prompt: str) -> int:
        """Start reading `prompt`: the tokens it held of it (now it holds the whole prompt)."""
        shared = [(len(os.path.commonprefix([prompt, h])), k) for k, h in enumerate(self.held)]
        same, k = max(shared, default=(0, -1))
        if k >= 0 and same >= len(self.held[k]) / 2:  # llama-server's slot similarity, 0.5
            self.held.pop(k)
        self.held.append(prompt)
        while sum(len(h) for h in self.held) / CHARS_PER_TOKEN > CACHE_TOKENS and len(self.held) > 1:
            self.held.pop(0)
        return int(same / CHARS_PER_TOKEN)


def simulate(requests, policy: str) -> tuple[list[float], int]:
    """Each request's TTFT (seconds) and the cached tokens of all, under `policy` ("llmgw",
    "best": each document or conversation on one replica, "round-robin")."""
    prepared = [check_request("/v1/chat/completions", {"model": "m", "messages": m}, MODEL) for _, _, m in requests]
    engines = [_Engine() for _ in range(REPLICAS)]
    balancer, pool = Balancer(seed=7), [Candidate(id=f"r{i}", slots=SLOTS) for i in range(REPLICAS)]
    sent: dict[int, tuple[int, object, int]] = {}
    ttft, cached, arrived, now_ms, done = [0.0] * len(requests), 0, 0, 0.0, 0
    while done < len(requests):
        while arrived < len(requests) and requests[arrived][0] * 1000 <= now_ms:
            i, p = arrived, prepared[arrived]
            if policy == "llmgw":
                choice, _ = balancer.pick(pool, p.blocks, now_ms / 1000, size=p.size)
                r = int(choice.id[1:])
                sent[i] = (r, balancer.started(choice.id, p.blocks, p.size), 0)
            else:
                r = requests[i][1] % REPLICAS if policy == "best" else i % REPLICAS
            engines[r].queue.append(i)
            arrived += 1
        for e in engines:
            if e.busy is None and e.queue:
                e.busy = e.queue.pop(0)
                text = prepared[e.busy].prompt
                held = e.take(text)
                tokens = int(len(text) / CHARS_PER_TOKEN)
                e.left_ms, e.began_ms = ANSWER_MS + READ_MS * (tokens - held), now_ms
                cached += held
                if policy == "llmgw":
                    r, s, _ = sent[e.busy]
                    sent[e.busy] = (r, s, held)
        busy = [e for e in engines if e.busy is not None]
        rate = min(1.0, CORES / len(busy)) if busy else 0.0
        for e in busy:
            e.left_ms -= STEP_MS * rate
            if e.left_ms <= 0:
                i, p = e.busy, prepared[e.busy]
                ttft[i] = (now_ms + STEP_MS) / 1000 - requests[i][0]
                if policy == "llmgw":
                    r, s, held = sent.pop(i)
                    tokens = int(len(p.prompt) / CHARS_PER_TOKEN)
                    balancer.finished(f"r{r}", True, p.blocks, s.work)
                    balancer.served(f"r{r}", p.blocks, tokens, held, s.believed, p.size)
                    read = (tokens - held) * CHARS_PER_TOKEN  # its timing: as long as it took, sharing the cores
                    balancer.measured(f"r{r}", int(read), now_ms + STEP_MS - e.began_ms)
                e.busy, done = None, done + 1
        now_ms += STEP_MS
        if not busy and arrived < len(requests) and not any(e.queue for e in engines):  # idle: to the next arrival
            now_ms = max(now_ms, requests[arrived][0] * 1000)
    return ttft, cached


WORKLOADS = {
    "documents": lambda seed: workload(RATE, seed),
    "documents x2": lambda seed: workload(2 * RATE, seed),
    "multi-turn": lambda seed: multi_turn(RATE, seed),
}
POLICIES = ("round-robin", "llmgw", "best")


def main() -> int:
    seeds = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 20
    print(
        f"modelled engines: {REPLICAS}, {READ_MS:g} ms a prompt token not held, {ANSWER_MS:g} ms a request, "
        f"{CORES} cores shared, {CACHE_TOKENS} tokens held each; {seeds} arrival seeds a workload"
    )
    for name, make in WORKLOADS.items():
        runs = {p: [] for p in POLICIES}
        for seed in range(seeds):
            requests = make(1000 + seed)
            for p in POLICIES:
                runs[p].append(simulate(requests, p))
        print(f"\n{name} (medians over the seeds)")
        print(f"{'':14}{'TTFT p50 ms':>12}{'p99 ms':>9}{'cached of best':>16}")
        for p in POLICIES:
            p50 = statistics.median(statistics.median(t) for t, _ in runs[p]) * 1000
            p99 = statistics.median(statistics.quantiles(t, n=100)[98] for t, _ in runs[p]) * 1000
            share = statistics.median(c / max(b[1], 1) for (_, c), b in zip(runs[p], runs["best"], strict=True))
            print(f"{p:14}{p50:12.0f}{p99:9.0f}{share:16.0%}")
        near = sum(
            statistics.median(mine) <= 1.1 * statistics.median(best)
            for (mine, _), (best, _) in zip(runs["llmgw"], runs["best"], strict=True)
        )
        print(f"llmgw's p50 within 10% of the best assignment's on {near} of {seeds} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
