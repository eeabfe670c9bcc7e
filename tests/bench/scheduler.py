"""How long the scheduler's reconcile takes over a simulated fleet (goal: a full pass over 5,000
nodes and 1,000 models well under a second on one core, growing no worse than linearly).

Two passes per fleet size: placing 1,000 replicas from nothing (1,000 models, 60% with a card
profile and a CPU fallback), then the steady pass over everything running (nothing to do, which
is what the scheduler does every tick). The reference beside them is the same placement scoring
every node that fits (`score_nodes=0`) rather than the first 100 found from a rotating start,
measured on a tenth of the replicas and scaled up. Run with `just bench`.
"""

from __future__ import annotations

import itertools
import random
import time

import msgspec

from llmgw.bus import collector_paused
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, Scaling
from llmgw.scheduler.core import Actual, Desired, NodeView, Policy, reconcile
from llmgw.scheduler.solver import quiet_highs

GB = 10**9
NOW = 1_000_000.0
CLASSES = [("h100-80g", 81559), ("l40s-48g", 46068), ("a100-40g", 40960), ("l4-24g", 23034)]


def fleet(n: int, rng: random.Random) -> dict[str, NodeView]:
    nodes = {}
    for i in range(n):
        name = f"node-{i:05d}"
        gpus = []
        if rng.random() < 0.6:
            cls, mem = rng.choice(CLASSES)
            gpus = [
                GpuInfo(index=k, uuid=f"{name}-{k}", name=cls, cls=cls, memory_total_mb=mem)
                for k in range(rng.choice([1, 2, 4, 8]))
            ]
        total = rng.choice([64, 128, 256, 512]) * 1024
        info = NodeInfo(
            node=name,
            hostname=name,
            cpus=rng.choice([16, 32, 64, 128]),
            memory_total_mb=total,
            memory_available_mb=total,
            gpus=gpus,
            engines={"llamacpp": "1", "vllm": "0.11"},
            membw_all_gbs=rng.uniform(40, 400),
            membw_one_gbs=rng.uniform(8, 14),
            labels={"rack": f"r{i // 40}"},
        )
        nodes[name] = NodeView(info=info, last_seen=NOW)
    return nodes


def catalog(n: int, rng: random.Random) -> tuple[dict[str, Model], dict[str, int]]:
    models, weights = {}, {}
    for i in range(n):
        source = f"org/repo-{i}/model.gguf"
        weights[source] = rng.choice([1, 4, 8, 16]) * GB
        profiles = [Profile(name="cpu", cpu_cores=rng.choice([4, 8]))]
        if rng.random() < 0.6:
            profiles.insert(0, Profile(name="gpu", gpus=rng.choice([1, 1, 2]), priority=10))
        models[f"m{i}"] = Model(name=f"m{i}", source=source, scaling=Scaling(min=1, max=1), profiles=profiles)
    return models, weights


def timed(models, nodes, running, weights, ids, policy=Policy()):
    """One reconcile pass and the CPU seconds it took (the machine is shared: wall time is noisy),
    run as the scheduler runs it: the cycle collector paused, its young generation taken after."""
    desired, actual = Desired(models=models), Actual(nodes=nodes, replicas=running, weights=weights)
    t = time.process_time()
    with collector_paused():
        out = reconcile(desired, actual, NOW, policy, ids=ids, solver=quiet_highs)
    return time.process_time() - t, out


def main() -> None:
    rng = random.Random(11)
    models, weights = catalog(1000, rng)
    rows = []
    for size in (1000, 5000):
        nodes = fleet(size, random.Random(size))
        ids = (f"r{i}" for i in itertools.count())
        place_s, plan = timed(models, nodes, [], weights, ids)
        running = [msgspec.structs.replace(s.replica, state="ready") for s in plan.starts]
        steady_s, steady = timed(models, nodes, running, weights, ids)
        assert not steady.starts and not steady.stops, "the steady pass should have nothing to do"
        tenth = dict(itertools.islice(models.items(), 100))
        every_s, _ = timed(tenth, nodes, [], weights, ids, Policy(score_nodes=0))
        rows.append((size, place_s, len(plan.starts), steady_s, every_s * 10))
    print("1,000 models (60% card profile + CPU fallback), one replica each; one core, one run")
    print(f"{'nodes':>6}{'place 1,000 s':>15}{'placed':>8}{'steady pass s':>15}{'score all s':>13}{'ratio':>7}")
    for size, place_s, placed, steady_s, every_s in rows:
        print(f"{size:6d}{place_s:15.3f}{placed:8d}{steady_s:15.3f}{every_s:13.3f}{every_s / place_s:6.1f}x")
    (small, p1, _, s1, _), (big, p5, _, s5, _) = rows
    print(f"growth 1,000 -> 5,000 nodes: placing {p5 / p1:.1f}x, steady {s5 / s1:.1f}x (linear would be 5.0x)")
    print(
        f"goal, a full pass over 5,000 nodes well under 1 s: steady {'met' if s5 < 0.5 else 'NOT met'} ({s5:.3f} s); "
        f"placing all 1,000 at once {'met' if p5 < 0.5 else 'NOT met'} ({p5:.3f} s)"
    )


if __name__ == "__main__":
    main()
