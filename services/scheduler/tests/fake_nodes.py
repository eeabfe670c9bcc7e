"""Fake nodes made with a fluent builder, and reconcile passes over them."""

import itertools

from llmgw.proto import GpuInfo, Model, NodeInfo, Profile
from llmgw.scheduler.core import Actual, Desired, NodeView, reconcile
from llmgw.scheduler.placement import node_states

NOW = 1_000_000.0
GB = 10**9


class Node:
    """A fake node, built fluently: Node("a").cpus(64).memory(512).membw(300, 10).cards(8, "h100")."""

    def __init__(self, name: str) -> None:
        self.info = NodeInfo(
            node=name,
            hostname=name,
            cpus=16,
            memory_total_mb=128 * 1024,
            memory_available_mb=128 * 1024,
            engines={"llamacpp": "1", "llamacpp-rpc": "1", "vllm": "0.11"},
        )
        self.seen, self.held = NOW, []

    def cpus(self, n):
        self.info.cpus = n
        return self

    def memory(self, gib):
        self.info.memory_total_mb = self.info.memory_available_mb = gib * 1024
        return self

    def membw(self, every, one):
        self.info.membw_all_gbs, self.info.membw_one_gbs = every, one
        return self

    def cards(self, n, cls="h100-80g", mb=81559, foreign=0, cc="9.0"):
        self.info.gpus = [
            GpuInfo(
                index=i,
                uuid=f"{self.info.node}-gpu{i}",
                name=cls,
                cls=cls,
                memory_total_mb=mb,
                memory_foreign_mb=foreign,
                compute_capability=cc,
            )
            for i in range(n)
        ]
        return self

    def labels(self, **kv):
        self.info.labels = kv
        return self

    def engines(self, *names):
        self.info.engines = dict.fromkeys(names, "1")
        return self

    def silent_for(self, seconds):
        self.seen = NOW - seconds
        return self

    def holding(self, *sources):
        self.held = list(sources)
        return self

    def view(self):
        return NodeView(info=self.info, last_seen=self.seen, weights=self.held)


def states(*nodes, replicas=()):
    return node_states({n.info.node: (n.info, n.seen, n.held) for n in nodes}, list(replicas), 512)


MODEL = Model(name="m", source="o/r/m.gguf")
CPU = Profile(name="cpu")
GPU = Profile(name="gpu", gpus=1, priority=10)


def run_model(model, nodes, replicas, now=NOW):
    """One pass for one model over `nodes`, its file 4 GB."""
    ids = (f"r{i}-{now}" for i in itertools.count())
    actual = Actual(nodes={n.info.node: n.view() for n in nodes}, replicas=replicas, weights={model.source: 4 * GB})
    return reconcile(Desired(models={model.name: model}), actual, now, ids=ids)


def run_models(models, nodes, replicas, now=NOW):
    """One pass for several models over `nodes`, each file 1 GB."""
    ids = (f"r{i}-{now}" for i in itertools.count())
    return reconcile(
        Desired(models={m.name: m for m in models}),
        Actual(nodes={n.info.node: n.view() for n in nodes}, replicas=replicas, weights={m.source: GB for m in models}),
        now,
        ids=ids,
    )
