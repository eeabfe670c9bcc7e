"""How many more replicas of a profile the fleet takes now, and with lower classes' room taken
(`room_left`): counted as a pass places them, from the records as they are."""

from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState
from llmgw.scheduler.core import MOST_COUNTED, Actual, NodeView, Policy, room_left

NOW = 1_000_000.0
GB = 1024


def view(name, memory_mb, available_mb=None, cards=0, cpus=16):
    gpus = [
        GpuInfo(index=i, uuid=f"{name}-{i}", name="l4", cls="l4-24g", memory_total_mb=24 * GB) for i in range(cards)
    ]
    info = NodeInfo(
        node=name,
        hostname=name,
        cpus=cpus,
        memory_total_mb=memory_mb,
        memory_available_mb=memory_mb if available_mb is None else available_mb,
        engines={"llamacpp": "1"},
        gpus=gpus,
    )
    return NodeView(info=info, last_seen=NOW)


def ready(i, model, node, memory_mb=0, gpus=(), cores=0):
    return ReplicaState(
        id=f"r{i}",
        model=model,
        profile="p",
        node=node,
        state="ready",
        memory_mb=memory_mb,
        gpus=list(gpus),
        cores=cores,
    )


TINY = Model(name="tiny", source="o/r/tiny.gguf", profiles=[Profile(name="cpu", host_memory_mb=3000)])
BATCH = Model(name="batch", source="o/r/batch.gguf", capacity_class="batch")
WEIGHTS = {"o/r/tiny.gguf": 10**9, "o/r/batch.gguf": 10**9}


def test_the_free_memory_counts_now_and_a_lower_classs_replicas_count_with_preemption():
    # 16 GiB, 6000 MiB of it held by two ready replicas of a batch model (out of what is available)
    actual = Actual(
        nodes={"a": view("a", 16 * GB, 16 * GB - 6000)},
        replicas=[ready(1, "batch", "a", 3000), ready(2, "batch", "a", 3000)],
        weights=WEIGHTS,
    )
    (room,) = room_left(TINY, actual, {"tiny": TINY, "batch": BATCH}, NOW, Policy())
    assert (room.profile, room.more_now, room.more_preempting) == ("cpu", (16 * GB - 6000 - 512) // 3000, 5)
    assert room.why == "" and room.most == MOST_COUNTED
    same_class = Model(name="batch", source="o/r/batch.gguf")  # standard, as tiny: not preempted
    (room,) = room_left(TINY, actual, {"tiny": TINY, "batch": same_class}, NOW, Policy())
    assert room.more_preempting == room.more_now == 3


def test_cards_held_by_a_lower_class_count_with_preemption_and_none_free_says_why():
    gpu = Model(name="tiny", source="o/r/tiny.gguf", profiles=[Profile(name="gpu", gpus=1)], capacity_class="critical")
    actual = Actual(
        nodes={"a": view("a", 64 * GB, cards=2)},
        replicas=[ready(1, "batch", "a", gpus=["a-0"]), ready(2, "batch", "a", gpus=["a-1"])],
        weights=WEIGHTS,
    )
    (room,) = room_left(gpu, actual, {"tiny": gpu, "batch": BATCH}, NOW, Policy())
    assert (room.more_now, room.more_preempting) == (0, 2)
    assert "a: cards: needs 1 free" in room.why and "has 0 (of 2)" in room.why


def test_counting_stops_at_the_most_and_a_file_not_confirmed_says_so():
    small = Model(name="tiny", source="o/r/tiny.gguf", profiles=[Profile(name="cpu", host_memory_mb=1)])
    actual = Actual(nodes={"a": view("a", 512 * GB)}, weights=WEIGHTS)
    (room,) = room_left(small, actual, {"tiny": small}, NOW, Policy())
    assert room.more_now == room.more_preempting == MOST_COUNTED
    (room,) = room_left(TINY, Actual(nodes=actual.nodes), {"tiny": TINY}, NOW, Policy())
    assert room.more_now == room.more_preempting == 0 and "the mirror has not confirmed" in room.why


def test_a_silent_node_takes_nothing_new():
    actual = Actual(nodes={"a": view("a", 16 * GB)}, weights=WEIGHTS)
    actual.nodes["a"].last_seen = NOW - 60
    (room,) = room_left(TINY, actual, {"tiny": TINY}, NOW, Policy())
    assert room.more_now == 0 and "a: ready:" in room.why
