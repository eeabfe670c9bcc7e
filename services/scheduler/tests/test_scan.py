"""The scan with a pass's index finds what a scan of every node finds: the same nodes that fit,
the same refusals in the same order with the same reasons, on fleets being filled replica by
replica and emptied now and then (the index skips some nodes, and judges the others from arrays
it keeps as replicas are claimed, held and released)."""

import gc
import random

import msgspec
import pytest

from llmgw.modelplan import DEFAULT_CPU
from llmgw.proto import GpuInfo, Profile, ReplicaState, Scaling
from llmgw.scheduler.placement import FILTERS, Index, cards_for, claim, hold, need_of, release
from llmgw.scheduler.placement._scan import JUDGED, STATIC, scan
from llmgw.scheduler.placement._scorers import Weights, _speed, speed_of
from services.scheduler.tests.fake_nodes import GB, MODEL, NOW, Node, run_model, states

CLASSES = [("h100-80g", 81559), ("a100-80g", 81920), ("l40s-48g", 46068), ("l4-24g", 23034)]
PROFILES = [
    Profile(name="cpu"),
    Profile(name="cpu-cores", cpu_cores=8),
    Profile(name="big-cpu", host_memory_mb=90_000),
    Profile(name="gpu", gpus=1),
    Profile(name="two", gpus=2),
    Profile(name="two-l40s", gpus=2, gpu_class="l40s-48g"),
    Profile(name="big-card", gpus=1, min_card_mb=40_000),
    Profile(name="fra1", node_selector={"site": "fra1"}),
    Profile(name="vllm", engine="vllm", gpus=1),
    Profile(name="rack-gpu", gpus=1, keep_within="rack"),
    Profile(name="hopper", gpus=1, min_compute="9.0"),
    Profile(name="nine", gpus=9),
    Profile(name="across", nodes=2),
    Profile(name="across-racks", nodes=2, gpus=1, keep_within="rack"),
]


def _fleet(rng: random.Random, size: int):
    nodes = []
    for i in range(size):
        node = Node(f"n{i:03d}").memory(rng.choice([32, 64, 128])).cpus(rng.choice([8, 16, 32]))
        if rng.random() < 0.8:  # memory rates (some without one core's), a few calibrated
            node.membw(rng.uniform(20, 300), rng.choice([None, rng.uniform(6, 14)]))
            if rng.random() < 0.2:
                node.info.cpu_calibration = msgspec.structs.replace(DEFAULT_CPU, core_share=rng.uniform(0.5, 1))
        if rng.random() < 0.6:
            cls, mb = rng.choice(CLASSES)
            count, cc = rng.choice([1, 2, 4, 4, 10]), rng.choice(["9.0", "8.9"])
            node.cards(count, cls, mb, foreign=rng.choice([0, 0, 0, 30_000]), cc=cc)
            if rng.random() < 0.4:  # and two cards of another class
                other, other_mb = rng.choice([c for c in CLASSES if c[0] != cls])
                node.info.gpus += [
                    GpuInfo(index=count + k, uuid=f"n{i:03d}-x{k}", name=other, cls=other, memory_total_mb=other_mb)
                    for k in range(2)
                ]
            if rng.random() < 0.3:  # a little foreign use on one card: less room there than on the rest
                rng.choice(node.info.gpus).memory_foreign_mb = 900
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
    placed: list[ReplicaState] = []
    later = None
    for step in range(120):
        # 42.5 GB on one card or 85 on two: 45,607 MiB a card (an l40s with a little foreign use
        # has 45,168); 152.5 on two: 81,025 MiB a card (such an h100 has 80,659, an a100 81,920)
        need = need_of(rng.choice(PROFILES), int(rng.choice([1, 4, 12, 40, 42.5, 85, 152.5]) * GB))
        start, limit = rng.randrange(200), rng.choice([0, 1, 5, 100])
        full, found = scan(need, nodes, NOW, 10, start, limit, None), scan(need, nodes, NOW, 10, start, limit, index)
        fit, full_why, why = found.fit, full.reasons, found.reasons
        assert fit == full.fit, (step, need.profile.name)
        assert [found.table.states[i] for i in found.at] == full.table.states == [nodes[name] for name in fit]
        assert len(why) == len(full_why)
        if later:  # the reasons of the scan before, read only now that its nodes have changed
            assert _reasons(later[0]) == _reasons(later[1]), (step - 1, "read later")
        later = (why, full_why) if step % 2 else None
        if not later:
            assert _reasons(why) == _reasons(full_why), (step, need.profile.name)
        # and the speed scorer, reading the card class from the index's columns, says what
        # speed_of says from the cards each node gives
        speeds = _speed(need, found.table, found.at, MODEL, Weights(), {}).tolist()
        assert speeds == [speed_of(need, nodes[name]) for name in fit], (step, need.profile.name)
        if fit:  # fill the fleet: the chosen node takes the replica
            name = rng.choice(fit)
            placed.append(
                ReplicaState(
                    id=f"r{step}",
                    model="m",
                    profile=need.profile.name,
                    node=name,
                    memory_mb=need.memory_mb,
                    cores=need.profile.cpu_cores or 0,
                    gpus=cards_for(need, nodes[name]),
                    state="starting",
                )
            )
            claim(nodes, placed[-1])
        if placed and rng.random() < 0.3:  # and empty it now and then: one stops at once, one is being stopped
            gone = placed.pop(rng.randrange(len(placed)))
            if rng.random() < 0.5:
                release(nodes, gone)
            else:
                hold(nodes, gone)


def test_every_filter_is_static_or_judged_by_the_index():
    assert [label for label, _ in FILTERS] == [*STATIC, *JUDGED]


def test_an_index_keeps_only_a_fleet_that_tells_it_of_changes():
    nodes = states(Node("a"))
    with pytest.raises(TypeError, match="node_states"):
        Index(dict(nodes), NOW, 10)


def test_the_table_tells_the_class_a_node_of_two_classes_gives():
    # two h100s, one with a little foreign use, and two a100s: a replica of two cards needing
    # 81,025 MiB each finds two such only among the a100s (the slower class)
    node = Node("a").cards(2, "h100-80g", 81559)
    node.info.gpus[1].memory_foreign_mb = 900
    node.info.gpus += [
        GpuInfo(index=2 + k, uuid=f"a-x{k}", name="a", cls="a100-80g", memory_total_mb=81920) for k in range(2)
    ]
    nodes = states(node)
    index = Index(nodes, NOW, 10)
    for gb, cards in ((152.5, ["a-x0", "a-x1"]), (140, ["a-gpu0", "a-gpu1"])):
        need = need_of(Profile(name="two", gpus=2), int(gb * GB))
        found = scan(need, nodes, NOW, 10, 0, 0, index)
        assert found.fit == ["a"]
        assert cards_for(need, nodes["a"]) == cards
        assert _speed(need, found.table, found.at, MODEL, Weights(), {}).tolist() == [speed_of(need, nodes["a"])]


def test_a_pass_leaves_nothing_for_the_garbage_collector():
    # the index watches the pass's fleet and holds it: held strongly both ways, every pass's
    # fleet (each node's state and lists) would wait for the collector's next full pass
    nodes = [Node(f"n{i}").cards(2, "l4-24g", 23034) for i in range(20)]
    gc.collect()
    gc.disable()
    try:
        plan = run_model(msgspec.structs.replace(MODEL, scaling=Scaling(min=6, max=6)), nodes, [])
        assert len(plan.starts) == 6
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_node_reporting_more_memory_and_cores_than_64_bits_hold_is_judged_as_a_full_scan_judges_it():
    # a heartbeat's figures are bounded below only: the columns keep what no 64-bit integer holds as 2**62
    huge = Node("a")
    huge.info.memory_available_mb = huge.info.cpus = 2**64 - 1
    nodes = states(huge, Node("b"))
    index = Index(nodes, NOW, 10)
    need = need_of(Profile(name="cpu", cpu_cores=8), 4 * GB)
    assert scan(need, nodes, NOW, 10, 0, 0, index).fit == scan(need, nodes, NOW, 10, 0, 0, None).fit == ["a", "b"]
    plan = run_model(msgspec.structs.replace(MODEL, scaling=Scaling(min=2, max=2)), [huge, Node("b")], [])
    assert len(plan.starts) == 2


def test_a_negative_limit_scans_every_node_with_or_without_the_index():
    nodes = states(Node("a"), Node("b"), Node("c"))
    index, need = Index(nodes, NOW, 10), need_of(Profile(name="cpu"), 4 * GB)
    assert (
        scan(need, nodes, NOW, 10, 1, -1, index).fit == scan(need, nodes, NOW, 10, 1, -1, None).fit == ["b", "c", "a"]
    )


def test_a_second_index_of_a_fleet_is_told_of_its_changes_and_the_first_serves_no_more():
    nodes = states(Node("a"), Node("b"))
    first, second = Index(nodes, NOW, 10), Index(nodes, NOW, 10)
    assert not first.serves(nodes, NOW, 10)
    assert second.serves(nodes, NOW, 10)
