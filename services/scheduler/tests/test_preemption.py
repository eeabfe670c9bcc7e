"""A higher capacity class takes the room of a lower one, which is held, never placed again in a loop."""

import msgspec
import pytest

from llmgw.proto import Model, Profile, ReplicaState, Scaling, fingerprint
from services.scheduler.tests.fake_nodes import NOW, Node
from services.scheduler.tests.fake_nodes import run_models as _pass


def _two(critical_class="critical"):
    batch = Model(
        name="batch", source="o/r/b.gguf", capacity_class="batch", profiles=[Profile(name="cpu", host_memory_mb=60_000)]
    )
    urgent = Model(
        name="urgent",
        source="o/r/u.gguf",
        capacity_class=critical_class,
        profiles=[Profile(name="cpu", host_memory_mb=60_000)],
    )
    return batch, urgent


def test_a_higher_class_takes_the_room_of_a_lower_one_which_is_held():
    batch, urgent = _two()
    running = ReplicaState(
        id="b1",
        model="batch",
        profile="cpu",
        node="a",
        state="ready",
        memory_mb=60_000,
        fingerprint=fingerprint(batch, batch.profiles[0]),
    )
    full = Node("a").memory(70)  # the batch replica's 60 GB are already out of what is available
    full.info.memory_available_mb = 70 * 1024 - 60_000
    plan = _pass([batch, urgent], [full], [running])
    assert [(s.replica.id, s.reason, s.drain) for s in plan.stops] == [
        ("b1", "preempted: gave room to critical model 'urgent'", False)
    ]
    assert [s.replica.model for s in plan.starts] == ["urgent"]
    assert plan.held == {"batch": "gave room to critical model 'urgent'"}


def test_a_replica_across_nodes_takes_the_room_of_as_many_lower_ones_as_it_needs_on_its_nodes():
    batch = Model(
        name="batch",
        source="o/r/b.gguf",
        capacity_class="batch",
        scaling=Scaling(min=3, max=3),
        profiles=[Profile(name="cpu", host_memory_mb=60_000)],
    )
    urgent = Model(
        name="urgent",
        source="o/r/u.gguf",
        capacity_class="critical",
        profiles=[Profile(name="rpc", host_memory_mb=60_000, nodes=2)],
    )
    nodes, running = [], []
    for i, name in enumerate("abc"):
        node = Node(name).memory(70)
        node.info.memory_available_mb = 70 * 1024 - 60_000  # each holds one batch replica
        nodes.append(node)
        running.append(
            ReplicaState(
                id=f"b{i}",
                model="batch",
                profile="cpu",
                node=name,
                state="ready",
                memory_mb=60_000,
                updated=NOW - 100 + i,
                fingerprint=fingerprint(batch, batch.profiles[0]),
            )
        )
    plan = _pass([batch, urgent], nodes, running)
    (start,) = [s for s in plan.starts if s.replica.model == "urgent"]
    spanned = {start.replica.node, *(w.node for w in start.replica.workers)}
    stopped = {s.replica.node for s in plan.stops}
    assert len(spanned) == 2 and stopped == spanned  # the two newest, and only those it runs on
    assert all(s.reason == "preempted: gave room to critical model 'urgent'" for s in plan.stops)
    assert plan.held == {"batch": "gave room to critical model 'urgent'"}


@pytest.mark.parametrize("cls", ["standard", "batch"])
def test_no_class_takes_room_from_its_own_or_a_higher_one(cls):
    batch, urgent = _two(cls)
    batch = msgspec.structs.replace(batch, capacity_class=cls)
    running = ReplicaState(
        id="b1",
        model="batch",
        profile="cpu",
        node="a",
        state="ready",
        memory_mb=60_000,
        fingerprint=fingerprint(batch, batch.profiles[0]),
    )
    full = Node("a").memory(70)
    full.info.memory_available_mb = 70 * 1024 - 60_000
    plan = _pass([batch, urgent], [full], [running])
    assert plan.stops == [] and plan.starts == [] and "urgent" in plan.unplaced


def test_a_held_model_is_not_placed_again_in_a_loop():
    batch, urgent = _two()
    replicas = [
        ReplicaState(
            id="b1",
            model="batch",
            profile="cpu",
            node="a",
            state="ready",
            memory_mb=60_000,
            fingerprint=fingerprint(batch, batch.profiles[0]),
        )
    ]
    stops = starts = 0
    for tick in range(10):
        node = Node("a").memory(70)
        node.seen = NOW + tick
        replicas = [msgspec.structs.replace(r, state="ready") if r.state == "pending" else r for r in replicas]
        node.info.memory_available_mb = 70 * 1024 - sum(r.memory_mb for r in replicas if r.state == "ready")
        plan = _pass([batch, urgent], [node], replicas, NOW + tick)
        stops, starts = stops + len(plan.stops), starts + len(plan.starts)
        gone = {s.replica.id for s in plan.stops}
        replicas = [r for r in replicas if r.id not in gone] + [s.replica for s in plan.starts]
    assert (stops, starts) == (1, 1) and [r.model for r in replicas] == ["urgent"]
    assert "batch" in plan.unplaced
