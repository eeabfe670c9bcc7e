"""Placement over fake nodes made with a fluent builder: every filter says why, every scorer
ranks, and reconcile keeps counts per profile without ever running fewer."""

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_sim import simulate as run_ticks

from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState, Scaling, fingerprint
from llmgw.scheduler.core import Actual, Desired, NodeView, reconcile
from llmgw.scheduler.placement import Search, Weights, need_of, node_states, place

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


def _run(model, nodes, replicas, now=NOW):
    ids = (f"r{i}-{now}" for i in itertools.count())
    actual = Actual(nodes={n.info.node: n.view() for n in nodes}, replicas=replicas, weights={model.source: 4 * GB})
    return reconcile(Desired(models={model.name: model}), actual, now, ids=ids)


def test_the_highest_priority_profile_that_fits_wins_else_the_next():
    model = Model(name="m", source="o/r/m.gguf", profiles=[CPU, GPU])
    on_cards = _run(model, [Node("g").cards(1)], [])
    assert [(s.profile.name, s.replica.gpus) for s in on_cards.starts] == [("gpu", ["g-gpu0"])]
    on_cpu = _run(model, [Node("c")], [])
    assert [s.profile.name for s in on_cpu.starts] == ["cpu"]


def test_no_fit_says_why_for_each_profile_and_node():
    model = Model(name="m", source="o/r/m.gguf", profiles=[Profile(name="cpu", host_memory_mb=10**6), GPU])
    plan = _run(model, [Node("c")], [])
    assert plan.unplaced["m"] == (
        "profile 'gpu': c: cards: needs 1 free any class cards of 5220 MiB; has 0 (of 0) | "
        "profile 'cpu': c: memory: needs 1000000 MiB, 130560 MiB free"
    )


def counted(gpu, cpu):
    profiles = [Profile(name="gpu", gpus=1, priority=10, replicas=gpu), Profile(name="cpu", cpu_cores=2, replicas=cpu)]
    return Model(name="m", source="o/r/m.gguf", profiles=profiles, scaling=Scaling(min=gpu + cpu, max=gpu + cpu))


def simulate(model, nodes, replicas, ticks=40):
    """The model's plans applied tick by tick over `nodes`, which heartbeat every tick."""

    def plan_for(current, now):
        for n in nodes:
            n.seen = now
        return _run(model, nodes, current, now)

    return run_ticks(plan_for, replicas, NOW, ticks)


def _running(model, gpu, cpu):
    fp = {p.name: fingerprint(model, p) for p in model.profiles}
    out = [
        ReplicaState(
            id=f"g{i}", model="m", profile="gpu", node="g", state="ready", gpus=[f"g-gpu{i}"], fingerprint=fp["gpu"]
        )
        for i in range(gpu)
    ]
    return out + [
        ReplicaState(id=f"c{i}", model="m", profile="cpu", node="c", state="ready", cores=2, fingerprint=fp["cpu"])
        for i in range(cpu)
    ]


def test_a_split_change_starts_the_short_profile_before_stopping_the_one_over():
    before, after = counted(7, 4), counted(9, 2)
    replicas = _running(before, 7, 4)
    first = _run(after, [Node("g").cards(10), Node("c").cpus(16)], replicas)
    assert [s.profile.name for s in first.starts] == ["gpu", "gpu"] and first.stops == []
    ready_seen, end = simulate(after, [Node("g").cards(10), Node("c").cpus(16)], replicas)
    assert min(ready_seen) >= 11
    assert sorted(r.profile for r in end) == ["cpu"] * 2 + ["gpu"] * 9


@settings(max_examples=40, deadline=None)
@given(gpu=st.integers(0, 5), cpu=st.integers(0, 5), new_gpu=st.integers(0, 5), new_cpu=st.integers(0, 5))
def test_no_split_change_runs_fewer_than_the_total_and_every_one_converges(gpu, cpu, new_gpu, new_cpu):
    if gpu + cpu == 0 or new_gpu + new_cpu == 0:
        return
    nodes = [Node("g").cards(12), Node("c").cpus(32)]
    ready_seen, end = simulate(counted(new_gpu, new_cpu), nodes, _running(counted(gpu, cpu), gpu, cpu))
    assert min(ready_seen) >= min(gpu + cpu, new_gpu + new_cpu)
    assert sorted(r.profile for r in end) == ["cpu"] * new_cpu + ["gpu"] * new_gpu
    held = [u for r in end for u in r.gpus]
    assert len(held) == len(set(held))  # never two replicas on one card


def test_a_lost_nodes_replicas_are_given_up_and_replaced_elsewhere_a_suspect_ones_kept():
    model = Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=1, max=1))
    on_b = ReplicaState(id="x", model="m", profile="cpu", node="b", state="ready", fingerprint=fingerprint(model, CPU))
    suspect = _run(model, [Node("a"), Node("b").silent_for(15)], [on_b])
    assert suspect.starts == [] and suspect.stops == []
    lost = _run(model, [Node("a"), Node("b").silent_for(45)], [on_b])
    assert [(s.replica.id, s.reachable, s.reason) for s in lost.stops] == [
        ("x", False, "node 'b' lost: no heartbeat for 45s")
    ]
    assert [s.replica.node for s in lost.starts] == ["a"]


def test_a_node_never_heard_of_is_lost_only_once_the_inventory_has_listened_long_enough():
    model = Model(name="m", source="o/r/m.gguf")
    on_z = ReplicaState(id="x", model="m", profile="cpu", node="z", state="ready", fingerprint=fingerprint(model, CPU))
    ids = (f"r{i}" for i in itertools.count())
    views = {"a": Node("a").view()}
    desired = Desired(models={"m": model})
    fresh = reconcile(
        desired, Actual(nodes=views, replicas=[on_z], weights={model.source: GB}, known_since=NOW - 5), NOW, ids=ids
    )
    assert fresh.stops == [] and fresh.starts == []
    later = reconcile(
        desired, Actual(nodes=views, replicas=[on_z], weights={model.source: GB}, known_since=NOW - 60), NOW, ids=ids
    )
    assert [s.replica.id for s in later.stops] == ["x"] and [s.replica.node for s in later.starts] == ["a"]


@pytest.mark.parametrize(
    ("hhmm", "want"), [("08:59", 1), ("09:00", 4), ("16:59", 4), ("17:00", 1), ("23:30", 0), ("02:00", 0), ("06:00", 1)]
)
def test_a_schedule_scales_by_time_of_day_windows_may_cross_midnight(hhmm, want):
    from llmgw.proto import ScheduleWindow
    from llmgw.scheduler.core import wanted

    scaling = Scaling(
        min=1,
        max=4,
        schedule=[
            ScheduleWindow(start="09:00", end="17:00", min=4, max=4),
            ScheduleWindow(start="23:00", end="06:00", min=0, max=0),
        ],
    )
    day = 20_000 * 86400
    now = day + int(hhmm[:2]) * 3600 + int(hhmm[3:]) * 60
    assert wanted(scaling, now) == want


def test_a_models_status_says_parked_backing_off_starting_or_stopped_and_why():
    from llmgw.scheduler.core import Plan, status

    model = Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=2, max=2))
    ready = [ReplicaState(id="x", model="m", profile="cpu", node="a", state="ready")]
    assert status(model, ready, Plan(), NOW).state == "starting"
    parked = status(model, ready, Plan(unplaced={"m": "a: memory: short"}), NOW)
    assert (parked.state, parked.ready, parked.wanted, parked.reason) == ("parked", 1, 2, "a: memory: short")
    backing = status(model, [], Plan(unplaced={"m": "backing off"}, backoff_until={"m": NOW + 20}), NOW)
    assert (backing.state, backing.until) == ("backing-off", NOW + 20)
    stopped = Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=0, max=0), stopped=Scaling(min=2, max=2))
    assert status(stopped, [], Plan(), NOW).state == "stopped"


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


def _pass(models, nodes, replicas, now=NOW):
    ids = (f"r{i}-{now}" for i in itertools.count())
    return reconcile(
        Desired(models={m.name: m for m in models}),
        Actual(nodes={n.info.node: n.view() for n in nodes}, replicas=replicas, weights={m.source: GB for m in models}),
        now,
        ids=ids,
    )


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
