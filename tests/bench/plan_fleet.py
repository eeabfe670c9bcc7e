"""How long `options` takes over a large fleet: 1,000 nodes and 20 files (goal: well under a second).

The reference beside it is the same work done the plain way: an Option built for every node
and way, then sorted (what a first version would do). Run with `just bench`.
"""

from __future__ import annotations

import random
import time

from llmgw.modelplan import CardGroup, FileFacts, NodeFacts, Option, Shape, options
from llmgw.modelplan._options import _card_ways, _cpu_way

GB = 10**9
CLASSES = [("h100-80g", 81559), ("l40s-48g", 46068), ("a100-40g", 40960), ("l4-24g", 23034)]


def fleet(n: int, rng: random.Random) -> list[NodeFacts]:
    nodes = []
    for i in range(n):
        cards = []
        if rng.random() < 0.6:
            cls, mem = rng.choice(CLASSES)
            count = rng.choice([1, 2, 4, 8])
            cards = [CardGroup(cls=cls, memory_mb=mem, count=count, free=rng.randint(0, count))]
        total = rng.choice([64, 128, 256, 512, 1024]) * 1024
        nodes.append(
            NodeFacts(
                name=f"node-{i:04d}",
                cpus=rng.choice([16, 32, 64, 128]),
                memory_total_mb=total,
                memory_available_mb=int(total * rng.random()),
                membw_all_gbs=rng.uniform(40, 400),
                membw_one_gbs=rng.uniform(8, 14),
                cards=cards,
                engines=["llamacpp", "vllm"],
            )
        )
    return nodes


def files(n: int) -> list[FileFacts]:
    out = []
    for i in range(n):
        weights = int((0.5 + i) * 4 * GB)
        shape = Shape(
            layers=32 + i,
            embedding=4096,
            feed_forward=14336,
            heads=32,
            kv_heads=8,
            key_length=128,
            value_length=128,
            vocab=128256,
            parameters=weights,
            weight_bytes=weights,
            active_bytes=weights,
        )
        out.append(
            FileFacts(name=f"m-{i}.gguf" if i % 2 else f"m-{i}", format="gguf" if i % 2 else "safetensors", shape=shape)
        )
    return out


def plain(fs: list[FileFacts], nodes: list[NodeFacts], context: int) -> list[Option]:
    out = []
    for f in fs:
        for node in nodes:
            ways = list(_card_ways(f, node, context, 1))
            cpu = _cpu_way(f, node, context, 1, None)
            if cpu:
                ways.append(cpu)
            for (engine, device, cards, tp), t, need, have, free, tps in ways:
                out.append(
                    Option(
                        file=f.name,
                        engine=engine,
                        device=device,
                        cards=cards,
                        tensor_parallel=tp,
                        threads=t,
                        need_mb=need,
                        have_mb=have,
                        node=node.name,
                        nodes_free=int(free),
                        nodes_fit=1,
                        tokens_per_second=tps,
                        kv_per_1000_mb=0.0,
                    )
                )
    out.sort(key=lambda o: (not o.free_now, -o.tokens_per_second, o.cards))
    return out


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    rng = random.Random(7)
    nodes, fs = fleet(1000, rng), files(20)
    ours, ranked = best_of(lambda: options(fs, nodes, 8192))
    ref, every = best_of(lambda: plain(fs, nodes, 8192))
    print("1,000 nodes (60% with cards), 20 files (gguf and safetensors), context 8192; best of 3")
    print(f"{'':30}{'seconds':>9}{'ways':>8}")
    print(f"{'llmgw.modelplan.options':30}{ours:9.3f}{len(ranked):8d}")
    print(f"{'plain: an Option per node':30}{ref:9.3f}{len(every):8d}")
    print(f"ratio {ref / ours:.2f}x; goal well under 1 s: {'met' if ours < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
