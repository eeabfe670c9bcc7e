"""What relaying a stream costs a gateway per token, against peers in the same run (issue 42).

An engine writes one event per token over time, and each costs a gateway a read and a write; the
gateway bench's stub answers in one buffer, so it cannot show that. Here a stand-in engine
(`paced_engine.py`, on the load core beside wrk) answers every request with 256 token events:
paced, one every 2 ms to each of 16 streams at once (an engine's batch decoding), and in a burst,
all 256 written back to back to each of 4 streams. Each gateway runs alone on the other core
(`taskset`): nginx as a plain reverse proxy, buffering off (the floor), vllm-router (Rust,
round-robin) and llmgw's router with a plain key. Figures: the gateway's CPU (user + system, its
whole process tree) per relayed token, tokens relayed a second, and how many a second one core
would relay at that cost; each row's best of `ROUNDS` rounds taken in turn. Before the runs, each
gateway's CPU while nothing is asked of it (`IDLE_S`, once started and settled): what its own
timers cost, counted in every figure of a run too. Goal: llmgw's CPU per token at most 1.5x
vllm-router's, judged on the median of the rounds' ratios (a round runs the rows in turn). Run
with `just bench`, or `python tests/bench/streams.py`.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway import PATH, load_script, wrk
from gateway_peers import (
    LOAD_CORE,
    Peer,
    Unavailable,
    cpu_seconds,
    settle,
    start_group,
    start_nginx,
    start_router,
    start_vllm_router,
    wait_ok,
)

from llmgw.bus import free_port

__all__ = ["main"]

TOKENS = 256
ROUNDS = 3
IDLE_S = 10.0
MODES = {"paced": (2.0, 16, 6), "burst": (0.0, 4, 4)}
"""Each mode: the engine's gap between a stream's events (ms; 0: back to back), the streams at
once (wrk's connections) and the seconds each run lasts."""


@dataclass
class Row:
    """A gateway's runs per mode: (CPU seconds, tokens, seconds) each; or why it has none."""

    name: str
    start: object
    peers: dict[str, Peer] = field(default_factory=dict)
    why: str = ""
    runs: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)
    idle: float | None = None
    """CPU ms a second while nothing is asked of it."""

    def per_token(self, mode: str) -> list[float]:
        """Each round's CPU µs per token."""
        return [cpu / max(tokens, 1) * 1e6 for cpu, tokens, _ in self.runs[mode]]

    def best(self, mode: str) -> tuple[float, float]:
        """The lowest CPU µs per token of its rounds, and tokens a second in that round."""
        cpu, tokens, seconds = min(self.runs[mode], key=lambda r: r[0] / max(r[1], 1))
        return cpu / max(tokens, 1) * 1e6, tokens / seconds


def start_engine(stack: contextlib.ExitStack, tmp: Path, gap_ms: float) -> Peer:
    """The paced stand-in engine on the load core."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / f"engine-{gap_ms}.log"
    argv = [sys.executable, str(Path(__file__).with_name("paced_engine.py")), "--port", str(port)]
    proc = start_group(stack, [*argv, "--tokens", str(TOKENS), "--gap-ms", str(gap_ms)], LOAD_CORE, log)
    wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=30)
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid)


def measure(script: Path, peer: Peer, connections: int, seconds: int) -> tuple[float, int, float]:
    """One wrk run through `peer`: the gateway's CPU seconds, the tokens it relayed, the seconds."""
    settle(peer)
    before = cpu_seconds(peer)
    step = wrk(script, peer, connections, seconds)
    if step.errors:
        raise Unavailable(f"{step.errors} failed requests")
    return cpu_seconds(peer) - before, round(step.rps * seconds) * TOKENS, float(seconds)


def idle_cpu(peer: Peer) -> float:
    """A gateway's CPU ms a second over `IDLE_S` with nothing asked of it (once settled)."""
    settle(peer)
    before = cpu_seconds(peer)
    time.sleep(IDLE_S)
    return (cpu_seconds(peer) - before) / IDLE_S * 1e3


def main() -> int:
    """Every row in every mode, `ROUNDS` times in turn; then the table."""
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="llmgw-streams-") as d:
        tmp = Path(d)
        try:
            script = load_script(tmp, TOKENS)
        except Unavailable as e:
            print(f"no load generator, nothing measured: {e}")
            return 1
        engines = {mode: start_engine(stack, tmp, gap) for mode, (gap, _, _) in MODES.items()}
        rows = [
            Row("nginx (C)", lambda url, m: start_nginx(stack, tmp / f"nginx-{m}", url)),
            Row("vllm-router (Rust)", lambda url, m: start_vllm_router(stack, tmp / f"vr-{m}", url)),
            Row("llmgw plain key", lambda url, m: start_router(stack, tmp / f"llmgw-{m}", url)),
        ]
        for row in rows:
            try:
                row.peers = {mode: row.start(engine.url, mode) for mode, engine in engines.items()}
            except Unavailable as e:
                row.why = str(e).replace("\n", " ")[:160]
        for row in rows:
            if row.peers:
                row.idle = idle_cpu(next(iter(row.peers.values())))
        for i in range(ROUNDS):
            print(f"round {i + 1} of {ROUNDS}", file=sys.stderr)
            for row in rows:
                for mode, peer in row.peers.items():
                    _, connections, seconds = MODES[mode]
                    try:
                        row.runs.setdefault(mode, []).append(measure(script, peer, connections, seconds))
                    except Unavailable as e:
                        row.why, row.peers = str(e), {}
                        break
        report(rows)
    return 0


def report(rows: list[Row]) -> None:
    """The table and the goal."""
    print(f"{TOKENS} token events a stream through {PATH}; best of {ROUNDS} rounds; gateway alone on one core")
    for mode, (gap, connections, seconds) in MODES.items():
        how = f"one event every {gap:g} ms" if gap else "back to back"
        print(f"\n{mode}: {how}, {connections} streams at once, {seconds} s a run")
        print(f"{'':20}{'CPU µs/token':>13}{'tokens/s':>10}{'tokens/s a core':>17}")
        for row in rows:
            if mode not in row.runs or row.why:
                print(f"{row.name:20}not measured: {row.why or 'no run'}")
                continue
            per, rate = row.best(mode)
            print(f"{row.name:20}{per:13.2f}{rate:10.0f}{1e6 / per:17.0f}")
    print(f"\nidle: CPU ms a second over {IDLE_S:g} s with nothing asked (timers, heartbeats)")
    for row in rows:
        print(f"{row.name:20}{'not measured' if row.idle is None else f'{row.idle:13.1f}'}")
    by = {r.name.split(" (")[0]: r for r in rows if r.runs and not r.why}
    if "llmgw plain key" not in by or "vllm-router" not in by:
        print("\nllmgw or vllm-router was not measured: the goal cannot be judged")
        return
    for mode in MODES:
        ours, theirs = by["llmgw plain key"], by["vllm-router"]
        best = ours.best(mode)[0] / theirs.best(mode)[0]
        pairs = zip(ours.per_token(mode), theirs.per_token(mode), strict=True)
        paired = statistics.median(a / b for a, b in pairs)  # rows run in turn: a pair shares the machine's phase
        met = "met    " if paired <= 1.5 else "NOT met"
        print(
            f"{met}  {mode}: llmgw's CPU per token is {paired:.2f}x vllm-router's, the median of rounds side by side "
            f"({best:.2f}x best against best; goal <= 1.5x)"
        )


if __name__ == "__main__":
    sys.exit(main())
