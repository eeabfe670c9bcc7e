"""Placement over fake nodes: every filter says why, every scorer ranks, and a replica across
nodes takes a share on each of a group that fits together."""

import msgspec
import pytest

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.placement import Search, Weights, need_of, place, speed_of
from services.scheduler.tests.fake_nodes import CPU, GB, GPU, MODEL, NOW, Node, states
from services.scheduler.tests.fake_nodes import run_model as _run


@pytest.mark.parametrize(
    ("profile", "node", "reason"),
    [
        (CPU, Node("a").silent_for(60), "ready: no heartbeat for 60s"),
        (Profile(node_selector={"site": "fra1"}), Node("a").labels(site="ams1"), "labels: lacks the labels site=fra1"),
        (Profile(engine="vllm", gpus=1), Node("a").engines("llamacpp").cards(1), "engine: has no vllm (has llamacpp)"),
        (Profile(gpus=1, gpu_class="l40s-48g"), Node("a").cards(2), "cards: needs 1 free l40s-48g cards of"),
        (Profile(gpus=2), Node("a").cards(2, foreign=40000), "cards: needs 2 free any class cards of"),
        (
            Profile(gpus=1, min_compute="8.9"),
            Node("a").cards(1, cc="8.0"),
            "cards: needs 1 free any class cards of 5220 MiB; has 0 (of 1); "
            "its cards: compute capability 8.0, under 8.9",
        ),
        (
            Profile(gpus=1, min_card_mb=40000),
            Node("a").cards(1, "t4-16g", 15360),
            "cards: needs 1 free any class cards of 5220 MiB; has 0 (of 1); its cards: 15360 MiB, under 40000",
        ),
        (Profile(host_memory_mb=300_000), Node("a").memory(64), "memory: needs 300000 MiB, 65024 MiB free"),
        (Profile(cpu_cores=32), Node("a").cpus(16), "cores: needs 32 cores, 16 of 16 free"),
        (Profile(nodes=2), Node("a").engines("llamacpp"), "engine: has no llamacpp RPC worker, which a replica across"),
        (Profile(nodes=2, keep_within="row"), Node("a").labels(rack="r1"), "keep_within: has no 'row' label"),
    ],
)
def test_each_filter_says_why_a_node_cannot_take_the_replica(profile, node, reason):
    where, why = place(need_of(profile, 4 * GB), MODEL, states(node), NOW, Search(stale_s=10))
    assert where is None and why["a"].startswith(reason)


def test_a_card_need_stands_for_every_class_that_meets_it():
    nodes = states(
        Node("t4").cards(1, "t4-16g", 15360, cc="7.5"),
        Node("l40s").cards(1, "l40s-48g", 46068, cc="8.9"),
        Node("a100").cards(1, "a100-80g", 81920, cc="8.0"),
    )
    fp8 = Profile(gpus=1, min_card_mb=40000, min_compute="8.9")
    where, why = place(need_of(fp8, 8 * GB), MODEL, nodes, NOW, Search(stale_s=10))
    assert where.node == "l40s" and set(why) == {"t4", "a100"}


def test_on_a_node_of_two_card_classes_a_replica_takes_the_fastest_and_is_scored_by_it():
    mixed = Node("mixed").cards(2, "l4-24g", 23034)
    mixed.info.gpus.append(
        msgspec.structs.replace(mixed.info.gpus[0], index=2, uuid="mixed-gpu2", cls="h100-80g", memory_total_mb=81559)
    )
    nodes = states(mixed, Node("h100").cards(1))
    need = need_of(Profile(gpus=1), 4 * GB)
    where, _ = place(need, MODEL, nodes, NOW, Search(stale_s=10, weights=Weights(pack=0, domain_spread=0)))
    assert (where.node, where.cards) == ("mixed", ["mixed-gpu2"])  # as fast as "h100": the later name wins the tie
    assert speed_of(need, nodes["mixed"]) == speed_of(need, nodes["h100"])


def test_cards_held_by_replicas_are_not_free():
    holding = ReplicaState(id="x", model="other", profile="gpu", node="a", state="ready", gpus=["a-gpu0", "a-gpu1"])
    where, why = place(
        need_of(Profile(gpus=2), 4 * GB), MODEL, states(Node("a").cards(3), replicas=[holding]), NOW, Search(stale_s=10)
    )
    assert where is None and "has 1 (of 3)" in why["a"]
    where, _ = place(
        need_of(Profile(gpus=1), 4 * GB), MODEL, states(Node("a").cards(3), replicas=[holding]), NOW, Search(stale_s=10)
    )
    assert where.cards == ["a-gpu2"]


def test_the_speed_scorer_chooses_the_node_where_the_model_answers_fastest():
    slow = Node("slow").cpus(64).memory(512).membw(40, 8)
    fast = Node("fast").cpus(64).memory(300).membw(300, 10)
    where, _ = place(need_of(Profile(cpu_cores=32), 18 * GB), MODEL, states(slow, fast), NOW, Search(stale_s=10))
    assert where.node == "fast" and where.scores["speed"] == 100.0


def test_a_faster_card_wins_over_a_slower_one():
    where, _ = place(
        need_of(GPU, 8 * GB),
        MODEL,
        states(Node("t4").cards(1, "t4-16g", 15360), Node("h100").cards(1)),
        NOW,
        Search(stale_s=10),
    )
    assert where.node == "h100" and where.cards == ["h100-gpu0"]


def test_weights_already_on_a_node_count_when_all_else_is_equal():
    where, _ = place(
        need_of(CPU, GB), MODEL, states(Node("a"), Node("b").holding("o/r/m.gguf")), NOW, Search(stale_s=10)
    )
    assert where.node == "b"


def test_replicas_of_one_model_spread_over_racks_as_a_preference():
    other = ReplicaState(id="x", model="m", profile="cpu", node="a1", state="ready")
    nodes = states(
        Node("a1").labels(rack="a"), Node("a2").labels(rack="a"), Node("b1").labels(rack="b"), replicas=[other]
    )
    where, _ = place(need_of(CPU, GB), MODEL, nodes, NOW, Search(stale_s=10))
    assert where.node == "b1"
    alone, _ = place(
        need_of(CPU, GB), MODEL, states(Node("a1").labels(rack="a"), replicas=[other]), NOW, Search(stale_s=10)
    )
    assert alone.node == "a1"  # dropped when nothing else fits


def test_binpack_fills_the_fullest_node_and_spread_the_emptiest():
    small, big = Node("small").memory(32), Node("big").memory(512)
    packed, _ = place(
        need_of(CPU, GB), MODEL, states(small, big), NOW, Search(weights=Weights(mode="binpack", speed=0))
    )
    spread, _ = place(need_of(CPU, GB), MODEL, states(small, big), NOW, Search(weights=Weights(mode="spread", speed=0)))
    assert (packed.node, spread.node) == ("small", "big")


# -- one replica across several nodes ------------------------------------------------------
ACROSS = Profile(name="rpc", nodes=3, keep_within="rack")


def test_a_replica_across_nodes_takes_a_share_on_each_within_one_rack():
    nodes = states(
        Node("a1").labels(rack="a"),
        Node("a2").labels(rack="a"),
        Node("b1").labels(rack="b").memory(512),
        Node("b2").labels(rack="b"),
        Node("b3").labels(rack="b"),
        Node("x"),
    )
    need = need_of(ACROSS, 30 * GB)
    assert need.memory_mb == int(10 * GB * 1.1 / 2**20) + 256  # a third of the weights each
    where, why = place(need, MODEL, nodes, NOW, Search(stale_s=10))
    assert where.node == "b1"  # the rack with three; the engine on its best node (most room)
    assert sorted(w.node for w in where.workers) == ["b2", "b3"]
    assert {w.memory_mb for w in where.workers} == {need.memory_mb}
    assert why["x"] == "keep_within: has no 'rack' label, and this profile keeps its nodes within one rack"


def test_a_replica_across_nodes_says_why_when_no_rack_has_enough():
    nodes = states(
        Node("a1").labels(rack="a"),
        Node("a2").labels(rack="a"),
        Node("b1").labels(rack="b"),
        Node("b2").labels(rack="b").memory(8),
    )
    where, why = place(need_of(ACROSS, 30 * GB), MODEL, nodes, NOW, Search(stale_s=10))
    assert where is None
    assert why["together"] == "nodes: needs 3 nodes that fit within one rack (most in one: 2, rack=a); 3 fit"
    assert why["b2"].startswith("memory: needs")
    anywhere, _ = place(need_of(Profile(name="rpc", nodes=3), 30 * GB), MODEL, nodes, NOW, Search(stale_s=10))
    assert anywhere.node and len(anywhere.workers) == 2  # without keep_within any three that fit


def test_cards_across_nodes_are_chosen_on_every_node():
    nodes = states(Node("g1").cards(2), Node("g2").cards(2), Node("g3").cards(1))
    where, _ = place(need_of(Profile(name="g", gpus=2, nodes=2), 200 * GB), MODEL, nodes, NOW, Search(stale_s=10))
    assert {where.node, where.workers[0].node} == {"g1", "g2"}
    assert len(where.cards) == 2 and len(where.workers[0].gpus) == 2


def test_a_replica_across_nodes_holds_room_on_each_and_is_lost_with_any_of_them():
    model = Model(name="m", source="o/r/m.gguf", context=4096, profiles=[Profile(name="rpc", nodes=2)])
    nodes = [Node("a"), Node("b"), Node("c")]
    plan = _run(model, nodes, [])
    (start,) = plan.starts
    spanned = {start.replica.node, start.replica.workers[0].node}
    held = states(*nodes, replicas=[start.replica])
    (spare,) = {"a", "b", "c"} - spanned
    assert all(held[n].free_mb == held[spare].free_mb - start.replica.memory_mb for n in spanned)
    ready = msgspec.structs.replace(start.replica, state="ready")
    assert _run(model, nodes, [ready]).starts == []
    worker = start.replica.workers[0].node
    lost = _run(model, [n.silent_for(45) if n.info.node == worker else n for n in nodes], [ready])
    assert [(s.replica.id, s.reachable, s.reason) for s in lost.stops] == [
        (ready.id, True, f"node '{worker}' lost: no heartbeat for 45s")
    ]
    (again,) = lost.starts
    assert worker not in {again.replica.node, *(w.node for w in again.replica.workers)}
