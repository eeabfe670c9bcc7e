"""The scan with a pass's index finds what a scan of every node finds: the same nodes that fit,
the same refusals in the same order with the same reasons, on fleets being filled replica by
replica (the index skips some nodes, and judges the cards and memory of the others itself)."""

import random

import pytest
from fake_nodes import GB, NOW, Node, states

from llmgw.proto import Profile, ReplicaState
from llmgw.scheduler.placement import Index, cards_for, claim, need_of
from llmgw.scheduler.placement._scan import scan

CLASSES = [("h100-80g", 81559), ("l40s-48g", 46068), ("l4-24g", 23034)]
PROFILES = [
    Profile(name="cpu"),
    Profile(name="cpu-cores", cpu_cores=8),
    Profile(name="big-cpu", host_memory_mb=90_000),
    Profile(name="gpu", gpus=1),
    Profile(name="two-l40s", gpus=2, gpu_class="l40s-48g"),
    Profile(name="big-card", gpus=1, min_card_mb=40_000),
    Profile(name="fra1", node_selector={"site": "fra1"}),
    Profile(name="vllm", engine="vllm", gpus=1),
    Profile(name="rack-gpu", gpus=1, keep_within="rack"),
]


def _fleet(rng: random.Random, size: int):
    nodes = []
    for i in range(size):
        node = Node(f"n{i:03d}").memory(rng.choice([32, 64, 128])).cpus(rng.choice([8, 16, 32]))
        if rng.random() < 0.6:
            cls, mb = rng.choice(CLASSES)
            node.cards(rng.choice([1, 2, 4]), cls, mb, foreign=rng.choice([0, 0, 0, 30_000]))
        if rng.random() < 0.5:
            node.labels(site=rng.choice(["fra1", "ams1"]), **({"rack": "r1"} if rng.random() < 0.5 else {}))
        if rng.random() < 0.1:
            node.engines("llamacpp")
        if rng.random() < 0.05:
            node.silent_for(60)
        nodes.append(node)
    return states(*nodes)


def _reasons(reasons) -> list[tuple[str, str]]:
    return list(reasons.items())


@pytest.mark.parametrize("seed", range(6))
def test_the_indexed_scan_finds_and_says_what_a_full_scan_does(seed):
    rng = random.Random(seed)
    nodes = _fleet(rng, 60)
    index = Index(nodes, NOW, 10)
    for step in range(120):
        need = need_of(rng.choice(PROFILES), rng.choice([1, 4, 12, 40]) * GB)
        start, limit = rng.randrange(200), rng.choice([0, 1, 5, 100])
        full_fit, full_states, full_why = scan(need, nodes, NOW, 10, start, limit, None)
        fit, fit_states, why = scan(need, nodes, NOW, 10, start, limit, index)
        assert fit == full_fit, (step, need.profile.name)
        assert fit_states == full_states == [nodes[name] for name in fit]
        assert len(why) == len(full_why)
        assert _reasons(why) == _reasons(full_why), (step, need.profile.name)
        if fit:  # fill the fleet: the chosen node takes the replica
            name = rng.choice(fit)
            cards = cards_for(need, nodes[name])
            claim(
                nodes,
                ReplicaState(
                    id=f"r{step}",
                    model="m",
                    profile=need.profile.name,
                    node=name,
                    memory_mb=need.memory_mb,
                    cores=need.profile.cpu_cores or 0,
                    gpus=cards,
                    state="starting",
                ),
            )
