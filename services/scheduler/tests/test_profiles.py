"""reconcile() over fake nodes with several profiles: the best that fits wins, counted profiles
keep their counts without ever running fewer, lost nodes are replaced, schedules scale."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.proto import Model, Profile, ReplicaState, Scaling, fingerprint
from llmgw.scheduler.core import Actual, Desired, reconcile
from services.scheduler.tests.fake_nodes import CPU, GB, GPU, NOW, Node
from services.scheduler.tests.fake_nodes import run_model as _run
from services.scheduler.tests.scheduler_sim import simulate as run_ticks


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
