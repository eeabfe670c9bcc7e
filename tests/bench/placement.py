"""How good the scheduler's placements are, not only how fast: on small heterogeneous fleets
solved exactly, the predicted tokens a second of what llmgw places against the optimum and
against bin-packing; then how long placing and a steady pass take as the fleet grows.

Fleets: CPU-only nodes of different memory rates and core counts, and nodes with 1-4 cards of
one of four classes (one in five with two classes). Models of 1B to 70B parameters (Q4_0 or
Q8_0, a context of 8,192), most with a card profile and a CPU fallback, some CPU-only or
card-only, wanting 1-3 replicas each. A replica's predicted tokens a second on a node is the scheduler's own
figure (`llmgw.scheduler.placement.speed_of`, what its speed scorer ranks by and what the
replica's record carries); its need is the scheduler's (`need_of`), and whether a node can take
it is the scheduler's filter chain on that node empty.

- llmgw: `llmgw.scheduler.core.reconcile` from nothing, default policy (one pass).
- best-fit (the bin-packing GPUStack documents as its default placement: the candidate left
  most used): the models by class then name (the order they came in), replicas and profiles as
  `reconcile` takes them, the same filters, each replica on
  the node left with the least room of what it takes (card memory for a card replica, host
  memory for a CPU one).
- optimum: an integer program solved by HiGHS (`highspy`): copies of each model's profiles on
  each node (and card class), at most the model's replicas, within each node's host memory,
  cores and cards of each class; first as many replicas as can be placed, then, among those
  placements, the most tokens a second.
- llmgw1, a diagnostic: the same `reconcile` in one try (`Policy.tries=1`): its speed order
  and the room it makes for what that order left unplaced, without the retries that put those
  models first.

Tight fleets too: 4-10 nodes asked for 30-60 replicas, where capacity binds (the table says on how
many the optimum places fewer than asked). Both HiGHS stages must prove their optimum.

Goals: llmgw at least 95% of the optimum on every fleet drawn, roomy and tight (placing as many replicas as
can be placed), and ahead of best-fit (as the optimum ranks placements: more replicas placed,
then more tokens a second); 10,000 nodes and 10,000 replicas placed in under 2 s, a steady pass
under 0.1 s, growing no worse than linearly.

Growth compares one fleet of 10,000 with ten fleets of 1,000 drawn alike (seeds 1000-1009: the
same mix of nodes and models, where one 1,000-node fleet's draw may hold a few percent fewer or
more cards than the large one's), two ways:
- the work a pass does, judged: the instructions it takes (valgrind's count, a few minutes;
  `instructions`; valgrind installed from Debian when run as root), the same however noisy the
  machine. Linear: the 10,000 fleet's pass takes no more than ten 1,000 ones' (within the
  count's own spread, `SPREAD`);
- its CPU seconds, shown beside: each fleet's best of five placing runs and of 25 steady ones
  (five a round: a steady pass is short, so more runs cost little and bring each fleet's best
  nearer its floor), the rounds taken in alternation. These also pay for the memory caches: a
  10,000 fleet's objects outgrow them where a 1,000 one's fit, so its time a replica is a few
  percent more for the same work (docs/benchmarks.md has the measurements).
Each pass runs as the scheduler runs it: the cycle collector paused
(`llmgw.bus.collector_paused`), its young generation taken after, counted. 20,000 shows how the
time grows past 10,000. Run with `just bench` (`--no-count` leaves out the instruction count;
`--quality` measures only the placements' quality).
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import msgspec
from placement_fleets import NOW, POLICY, Fleet, draw, total
from placement_solvers import best_fit, difference, llmgw, optimum

from llmgw.bus import collector_paused
from llmgw.proto import ReplicaState
from llmgw.scheduler.core import Actual, Desired, reconcile
from llmgw.scheduler.solver import quiet_highs

__all__ = ["Row", "instructions", "quality", "report", "scale"]

ROUNDS = 5
"""Rounds of the scale fleets, taken in alternation; each keeps its best (the machine is shared)."""
STEADY_RUNS = 5
"""Steady passes of each fleet a round (it is short: more runs, for a best as near its floor)."""
COUNTED_STEADY = 50
"""Steady passes counted for each placing one (`instructions`)."""
SPREAD = 0.01
"""How far apart instruction counts of the same passes land in processes alike (their memory
addresses differ: ~0.5% measured, each way), the most the growth may read over 10x for it."""

_COUNTED = """
import sys
sys.path.insert(0, {bench!r})
import msgspec
from placement import _steady
from placement_fleets import draw
from placement_solvers import llmgw
from llmgw.bus import collector_paused
n, many, places, steadies = map(int, sys.argv[1:])
small = draw(200, 200, seed=200, card_share=0.6)
small_running = [msgspec.structs.replace(r, state="ready") for r in llmgw(small)]
for _ in range(10):
    llmgw(small)
    _steady(small, small_running)
fleets = [draw(n, n, seed=n + i, card_share=0.6) for i in range(many)]
running = [[msgspec.structs.replace(r, state="ready") for r in llmgw(f)] for f in fleets]
for f, r in zip(fleets, running):
    _steady(f, r)
for f, r in zip(fleets, running):
    for _ in range(places):
        with collector_paused():
            llmgw(f)
    for _ in range(steadies):
        with collector_paused():
            _steady(f, r)
"""
"""A process that warms the interpreter up on a small fleet, then draws `many` fleets of N
(seeds N, N+1, ...), places each and runs a steady pass once, then on each `places` more placing
passes and `steadies` more steady passes, each as the scheduler runs one (the cycle collector
paused). The warm-up: CPython specializes a function's code only after its 8th call, and a
pass calls `reconcile` (and the comprehensions in it) once; without it the first passes counted
of one 10,000 fleet would run the slower generic code where ten 1,000 ones would not."""


@dataclass
class Row:
    """One fleet's placements: each one's tokens a second and replicas placed."""

    seed: int
    fleet: Fleet
    best: float
    best_n: int
    chosen: dict[tuple[str, str, str, str], int]
    ours: list[ReplicaState]
    ours_tps: float
    packed_tps: float
    packed_n: int
    ordered_tps: float
    ordered_n: int

    @property
    def ratio(self) -> float:
        """llmgw's share of the optimum."""
        return self.ours_tps / self.best

    @property
    def met(self) -> bool:
        """llmgw placed as many replicas as can be, at 95% of the optimum's tokens a second."""
        return len(self.ours) >= self.best_n and self.ratio >= 0.95


def quality(seeds: range, tight: bool = False) -> list[Row]:
    """For each seed, a fleet of 8-20 nodes and 10-40 replicas (`tight`: 4-10 nodes asked for
    30-60, more than most such fleets hold: capacity binds): the placements' totals."""
    rows = []
    for seed in seeds:
        rng = random.Random(seed)
        nodes, replicas = ((4, 10), (30, 60)) if tight else ((8, 20), (10, 40))
        nodes, replicas = rng.randint(*nodes), rng.randint(*replicas)
        f = draw(nodes, replicas, seed)
        ours, packed = llmgw(f), best_fit(f)
        ordered_placed = llmgw(f, msgspec.structs.replace(POLICY, tries=1))
        best, best_n, chosen = optimum(f)
        rows.append(
            Row(
                seed=seed,
                fleet=f,
                best=best,
                best_n=best_n,
                chosen=chosen,
                ours=ours,
                ours_tps=total(f, ours),
                packed_tps=total(f, packed),
                packed_n=len(packed),
                ordered_tps=total(f, ordered_placed),
                ordered_n=len(ordered_placed),
            )
        )
    return rows


def _cpu(fn, *args):
    """CPU seconds of `fn(*args)` run as the scheduler runs a pass, the cycle collector paused
    (`collector_paused`, its young generation taken after, counted), and what it gave (the
    machine is shared: wall time is noisy); the garbage of the run before is collected first,
    not counted against this one."""
    gc.collect()
    t = time.process_time()
    with collector_paused():
        out = fn(*args)
    return time.process_time() - t, out


def _steady(f: Fleet, running: list[ReplicaState]):
    ids = (f"s{i}" for i in itertools.count())
    actual = Actual(nodes=f.nodes, replicas=running, weights=f.weights, shapes=f.shapes)
    return reconcile(Desired(models=f.models), actual, NOW, POLICY, ids=ids, solver=quiet_highs)


def scale(sizes: dict[int, int], rounds: int = ROUNDS) -> dict[int, tuple[float, float, int, float]]:
    """For each size N, `sizes[N]` fleets of N nodes and N replicas drawn alike (seeds N, N+1, ...):
    the CPU seconds of placing all from nothing and of the steady pass after, each fleet's best
    of `rounds` runs (`STEADY_RUNS` steady ones a round; the fleets taken in alternation),
    summed over the size's fleets; how many were placed; and how far a fleet's runs varied at
    most."""
    fleets = {(n, n + i): draw(n, n, seed=n + i, card_share=0.6) for n, many in sizes.items() for i in range(many)}
    places: dict[tuple[int, int], list[float]] = {key: [] for key in fleets}
    steadies: dict[tuple[int, int], list[float]] = {key: [] for key in fleets}
    placed_n: dict[tuple[int, int], int] = {}
    for _ in range(rounds):
        for key, f in fleets.items():
            place_s, placed = _cpu(llmgw, f)
            running = [msgspec.structs.replace(r, state="ready") for r in placed]
            for _ in range(STEADY_RUNS):
                steady_s, steady = _cpu(_steady, f, running)
                assert not steady.starts and not steady.stops, "the steady pass should have nothing to do"
                steadies[key].append(steady_s)
            places[key].append(place_s)
            placed_n[key] = len(placed)
    out = {}
    for n in sizes:
        keys = [key for key in fleets if key[0] == n]
        varied = max(max(max(t[k]) / min(t[k]) for t in (places, steadies)) for k in keys) - 1
        place, steady = sum(min(places[k]) for k in keys), sum(min(steadies[k]) for k in keys)
        out[n] = (place, steady, sum(placed_n[k] for k in keys), varied)
    return out


def instructions(sizes: dict[int, int]) -> dict[int, tuple[float, float]] | str:
    """For each size N, the instructions of one pass placing all from nothing and of one steady
    pass, the mean over `sizes[N]` fleets drawn alike (valgrind's count, hash seed fixed): each
    the difference between a process that does them more often and one that does not
    (`_COUNTED`), over as many placing passes as the largest size takes once and
    `COUNTED_STEADY` times as many steady ones (so that the spread between processes alike,
    `SPREAD`, is small beside them); or why they were not counted."""
    from gateway_peers import Unavailable, ensure_debian  # here: the processes counted import this module

    try:
        valgrind = ensure_debian("valgrind", "valgrind")
    except Unavailable as e:
        return f"not counted: {e}"
    script = _COUNTED.format(bench=os.path.dirname(os.path.abspath(__file__)))
    # numpy's BLAS thread pool, idle in a pass, spins under valgrind: one thread, none to count
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}

    def count(*args: int) -> int:
        argv = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        argv += [sys.executable, "-c", script, *map(str, args)]
        run = subprocess.run(argv, capture_output=True, text=True, env=env)
        said = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
        if run.returncode or said is None:
            raise RuntimeError(f"valgrind counted nothing (exit {run.returncode}): {run.stderr.strip()[-300:]}")
        return int(said.group(1).replace(",", ""))

    counted = {}
    for n, many in sizes.items():
        places = max(1, max(sizes) // (n * many))
        try:
            base, place = count(n, many, 0, 0), count(n, many, places, 0)
            steady = count(n, many, 0, COUNTED_STEADY * places)
        except RuntimeError as e:
            return f"not counted: {e}"
        counted[n] = ((place - base) / (many * places), (steady - base) / (COUNTED_STEADY * many * places))
    return counted


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(rows: list[Row], fleets: str = "roomy") -> list[str]:
    """The quality table, its summary and the worst fleet's difference; the goal lines."""
    binding = sum(r.best_n < r.fleet.replicas for r in rows)
    print(f"\n{fleets.capitalize()} fleets: the optimum places fewer than asked on {binding} of {len(rows)}")
    print("Placement quality: predicted tokens a second of one reply (the scheduler's speed_of), summed over")
    print("the replicas placed. optimum: HiGHS, as many replicas as can be placed, then the most tokens a second.")
    print("best-fit: bin-packing (GPUStack's default), each replica on the node left with the least room.")
    print("llmgw1: the same reconcile in one try, without the retries (a diagnostic of what the retries add).")
    print("Ahead or behind as the optimum ranks: more replicas placed first, then more tokens a second.")
    head = f"{'seed':>4}{'nodes':>6}{'asked':>6}{'optimum':>9}{'n':>4}"
    head += "".join(f"{name:>9}{'n':>4}{'/opt':>7}" for name in ("llmgw", "best-fit", "llmgw1"))
    print(head)
    for r in rows:
        line = f"{r.seed:4d}{len(r.fleet.nodes):6d}{r.fleet.replicas:6d}{r.best:9.0f}{r.best_n:4d}"
        for tps, n in ((r.ours_tps, len(r.ours)), (r.packed_tps, r.packed_n), (r.ordered_tps, r.ordered_n)):
            line += f"{tps:9.0f}{n:4d}{tps / r.best:7.1%}"
        print(line + ("" if r.met else "  <"))
    ratios = [r.ratio for r in rows]
    packs = [r.packed_tps / r.best for r in rows]
    ordered = [r.ordered_tps / r.best for r in rows]
    # as the optimum ranks placements: more replicas placed first, then more tokens a second
    ahead = sum((len(r.ours), r.ours_tps) > (r.packed_n, r.packed_tps + 1e-6) for r in rows)
    behind = sum((len(r.ours), r.ours_tps) < (r.packed_n, r.packed_tps - 1e-6) for r in rows)
    short = sum(len(r.ours) < r.best_n for r in rows)
    print(
        f"of the optimum, min / median: llmgw {min(ratios):.1%} / {statistics.median(ratios):.1%}, "
        f"best-fit {min(packs):.1%} / {statistics.median(packs):.1%}, llmgw1 {min(ordered):.1%} / "
        f"{statistics.median(ordered):.1%}; llmgw placed fewer than could be on {short} fleets; "
        f"< marks a fleet short of the goal"
    )
    print(
        f"llmgw against best-fit (more replicas placed, then more tokens a second): ahead on {ahead} fleets, "
        f"behind on {behind}, tied on {len(rows) - ahead - behind}"
    )
    worst = min(rows, key=lambda r: (r.met, r.ratio))
    print(f"worst fleet (seed {worst.seed}), where llmgw and the optimum differ (tokens a second of each way):")
    for name, v in worst.fleet.nodes.items():
        i = v.info
        cards = ", ".join(f"{sum(g.cls == c for g in i.gpus)}x {c}" for c in dict.fromkeys(g.cls for g in i.gpus))
        memory = f"{i.memory_total_mb // 1024} GiB at {i.membw_all_gbs:.0f} GB/s"
        print(f"  {name}: {i.cpus} cores, {memory}; {cards or 'no cards'}")
    print("\n".join(difference(worst.fleet, worst.ours, worst.chosen)))
    met_all = sum(r.met for r in rows)
    return [
        f"{fleets} fleets: llmgw at least 95% of the optimum (placing as many) on every fleet: "
        f"{_met(met_all == len(rows))} ({met_all} of {len(rows)}; min {min(ratios):.1%})",
        f"{fleets} fleets: llmgw ahead of best-fit: {_met(behind == 0 and ahead > 0)} (ahead on {ahead}, "
        f"behind on {behind})",
    ]


def main() -> None:
    goals = report(quality(range(20))) + report(quality(range(20), tight=True), "tight")
    if "--quality" in sys.argv[1:]:
        print("goals:\n" + "\n".join(f"  {g}" for g in goals))
        return
    sizes = {1000: 10, 5000: 1, 10000: 1, 20000: 1}
    runs = scale(sizes)
    print()
    print("Scale: N nodes (60% with cards) and N replicas; CPU seconds of one process, each fleet's best of")
    print(f"{ROUNDS} placing and {ROUNDS * STEADY_RUNS} steady runs ({ROUNDS} rounds, the fleets in turn); ten")
    print("fleets of 1,000 drawn alike (seeds 1000-1009), their seconds summed: as many nodes and replicas")
    print("as the 10,000 one, of the same mix, so linear growth is the same time on both rows")
    head = f"{'fleets':>7}{'place all s':>13}{'us/replica':>12}{'placed':>8}{'steady pass s':>15}{'us/replica':>12}"
    print(f"{'N':>6}{head}{'varied':>8}")
    each = {}
    for n, many in sizes.items():
        place, steady, placed, varied = runs[n]
        each[n] = (place / many, steady / many)
        line = f"{many:7d}{place:13.3f}{place / placed * 1e6:12.1f}{placed:8d}{steady:15.3f}"
        print(f"{n:6d}{line}{steady / placed * 1e6:12.2f}{varied:7.0%}")
    (p1, s1), (p10, s10), (p20, s20) = each[1000], each[10000], each[20000]
    print(
        f"growth 1,000 -> 10,000 (one fleet against the mean of ten): placing {p10 / p1:.1f}x, steady {s10 / s1:.1f}x "
        "(linear would be 10.0x)"
    )
    print(f"growth 10,000 -> 20,000: placing {p20 / p10:.2f}x, steady {s20 / s10:.2f}x (linear would be 2.00x)")
    seconds = f"CPU seconds placing {p10 / p1:.1f}x, steady {s10 / s1:.1f}x"
    seconds += f"; 10,000 -> 20,000 {p20 / p10:.2f}x, {s20 / s10:.2f}x"
    if "--no-count" in sys.argv[1:]:
        growth = f"not judged: the instructions not counted (--no-count); {seconds}"
    elif isinstance(counted := _instructions({1000: sizes[1000], 10000: 1}), str):
        growth = f"not judged: the instructions {counted}; {seconds}"
    else:
        linear = max(counted) <= 10 * (1 + SPREAD)
        growth = f"{_met(linear)} in the work a pass does, its instructions 1,000 -> 10,000 (placing "
        growth += f"{counted[0]:.2f}x, steady {counted[1]:.2f}x; 10.0x linear, within {SPREAD:.0%}); {seconds}"
    goals += [
        f"10,000 nodes and 10,000 replicas placed in under 2 s: {_met(p10 < 2)} ({p10:.3f} s)",
        f"a steady pass over them under 0.1 s: {_met(s10 < 0.1)} ({s10:.3f} s)",
        f"growth no worse than linear: {growth}",
    ]
    print("goals:")
    print("\n".join(f"  {g}" for g in goals))


def _instructions(sizes: dict[int, int]) -> tuple[float, float] | str:
    """Print the instructions a pass takes at each size; how they grow from the smallest size to
    the largest, placing and steady (or why they were not counted)."""
    counted = instructions(sizes)
    if isinstance(counted, str):
        print(f"instructions {counted}")
        return counted
    print()
    print("Instructions a pass (valgrind --tool=cachegrind, hash seed 0): the work, whatever the machine's noise")
    print(f"{'N':>6}{'place all':>14}{'steady pass':>14}")
    for n, (place, steady) in counted.items():
        print(f"{n:6d}{place / 1e6:12.1f} M{steady / 1e6:12.1f} M")
    (p1, s1), (p10, s10) = counted[min(sizes)], counted[max(sizes)]
    ratio = max(sizes) / min(sizes)
    print(f"growth in instructions: placing {p10 / p1:.2f}x, steady {s10 / s1:.2f}x (linear would be {ratio:.1f}x)")
    return p10 / p1, s10 / s1


if __name__ == "__main__":
    main()
