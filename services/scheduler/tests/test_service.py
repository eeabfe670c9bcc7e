"""The scheduler's shell over real NATS with fake agents: one agent that never answers holds up
nobody else, and a catalog change is acted on at once rather than at the next tick."""

import asyncio
import gc
import time

import msgspec
import pytest

from llmgw.bus import call, kv_bucket
from llmgw.proto import BUCKETS, Empty, Model, NodeInfo, Profile, ReplicaReport, ReplicaState, Scaling, agent, scheduler
from llmgw.scheduler.core import Hearing, NodeView, health
from llmgw.scheduler.service import Scheduler, SchedulerConfig
from services.scheduler.tests.fake_agents import FakeAgent, fake_mirror, put_model


def config(**changes):
    return msgspec.structs.replace(SchedulerConfig(tick_s=0.3, stale_s=2.0, lost_s=30.0, lease_s=3.0), **changes)


def on(pool, name):
    """A model whose one replica runs only on the node `pool`."""
    profile = Profile(name="cpu", host_memory_mb=256, node_selector={"pool": pool})
    return Model(name=name, source=f"o/r/{name}.gguf", profiles=[profile], scaling=Scaling(min=1, max=1))


async def until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await predicate()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout}s")


async def ready_on(nc, node, model=None):
    replicas = (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas
    return [r for r in replicas if r.node == node and r.state == "ready" and model in (None, r.model)] or None


@pytest.fixture
async def fakes(nc):
    started = []

    async def add(*args, **kwargs):
        started.append(await FakeAgent(nc, *args, **kwargs).start())
        return started[-1]

    mirror = await fake_mirror(nc, slow={"o/r/slow.gguf"})
    yield add
    for fake in started:
        await fake.stop()
    await mirror.unsubscribe()


async def test_an_agent_that_never_answers_a_stop_leaves_other_nodes_fresh_and_placed_on(serve, nc, fakes):
    stray = ReplicaReport(id="ghost", model="gone", profile="cpu", node="x", state="ready")
    x = await fakes("x", silent=True, strays=[stray])  # every heartbeat asks for a stop it never answers
    sched = await serve(Scheduler(config()), config())
    await until(lambda: _asked(x, agent.REPLICA_STOP.subject("x")), timeout=10)
    await fakes("b")
    await put_model(nc, on("b", "first"))
    await until(lambda: ready_on(nc, "b", "first"), timeout=5)
    for _ in range(8):  # b's heartbeats are heard all along: never suspect
        health = (await call(nc, scheduler.NODE_LIST, Empty())).health
        assert health["b"].state == "ready" and health["b"].silent_s < sched.config.stale_s
        await asyncio.sleep(0.5)
    await put_model(nc, on("b", "second"))
    await until(lambda: ready_on(nc, "b", "second"), timeout=5)


async def test_a_start_that_an_agent_never_answers_holds_up_no_start_on_another_node(serve, nc, fakes):
    x = await fakes("x", silent=True)
    await fakes("b")
    await serve(Scheduler(config()), config())
    await put_model(nc, on("x", "a-on-x"))  # placed first (by name), never answered
    await until(lambda: _asked(x, agent.REPLICA_START.subject("x")), timeout=10)
    await put_model(nc, on("b", "b-on-b"))
    await until(lambda: ready_on(nc, "b", "b-on-b"), timeout=5)


async def test_a_catalog_change_is_acted_on_without_waiting_for_the_next_tick(serve, nc, fakes):
    await fakes("b")
    sched = await serve(Scheduler(config(tick_s=30.0)), config(tick_s=30.0))
    await until(lambda: _true(sched.leader and "b" in sched.nodes), timeout=10)
    await put_model(nc, on("b", "m"))
    await until(lambda: ready_on(nc, "b", "m"), timeout=10)  # the next tick is 30 s away


async def test_a_pass_runs_with_the_cycle_collector_paused_and_gives_it_back(serve, nc, fakes, monkeypatch):
    # a pass makes no cycles (test_scan); with the collector on, 10,000 nodes cost it a full walk a pass
    from llmgw.scheduler import applier

    seen, real = [], applier.reconcile

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(applier, "reconcile", watched)
    await fakes("b")
    await serve(Scheduler(config()), config())
    await put_model(nc, on("b", "m"))
    await until(lambda: ready_on(nc, "b", "m"), timeout=10)
    assert seen and not any(seen)
    assert gc.isenabled()


async def test_a_mirror_slow_to_confirm_one_file_holds_up_no_other_models_placement(serve, nc, fakes):
    await fakes("b")
    sched = await serve(Scheduler(config()), config())
    await until(lambda: _true(sched.leader and "b" in sched.nodes), timeout=10)
    await put_model(nc, on("b", "slow"))  # the mirror never answers about its file
    await asyncio.sleep(0.5)
    await put_model(nc, on("b", "quick"))
    await until(lambda: ready_on(nc, "b", "quick"), timeout=10)
    # placed while the ask about the slow file was still out: not after it timed out (then unconfirmed)
    assert "o/r/slow.gguf" in sched._stating and "o/r/slow.gguf" not in sched.unconfirmed
    assert not await ready_on(nc, "b", "slow")


async def recorded(nc, rid):
    """A replica's record as the replicas bucket holds it (what the router reads)."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["replicas"])
    return msgspec.json.decode((await kv.get(rid)).value, type=ReplicaState)


async def _asked(fake, subject):
    return subject in fake.asked


async def _true(value):
    return value


async def test_a_heartbeat_or_report_that_speaks_for_another_node_than_its_subject_is_ignored(serve, nc):
    from llmgw.proto import Heartbeat

    sched = await serve(Scheduler(config()), config())
    await until(lambda: _leading(sched), timeout=10)
    info = NodeInfo(node="victim", hostname="h", cpus=4, memory_total_mb=4096, memory_available_mb=4096)
    await nc.publish(agent.HEARTBEAT.subject("intruder"), msgspec.json.encode(Heartbeat(info=info)))
    honest = msgspec.structs.replace(info, node="intruder")
    await nc.publish(agent.HEARTBEAT.subject("intruder"), msgspec.json.encode(Heartbeat(info=honest)))

    async def listed():
        return [n.node for n in (await call(nc, scheduler.NODE_LIST, Empty())).nodes] or None

    assert await until(listed, timeout=5) == ["intruder"]


async def _leading(sched):
    return sched.leader


async def test_node_list_says_how_each_node_stands_by_the_cores_rule_leaving_out_deaf_time(serve, nc):
    sched = await serve(Scheduler(config()), config())  # suspect after 2 s, lost after 30 s
    now = time.time()
    sched.hearing = Hearing(deaf_s=100.0, at=now, last_beat=now)  # it could not hear for 100 s so far

    def view(node, ago, deaf_then):
        info = NodeInfo(node=node, hostname=node, cpus=4, memory_total_mb=4096, memory_available_mb=4096)
        return NodeView(info=info, last_seen=now - ago, deaf_s=deaf_then)

    sched.nodes.update(
        {
            "outage": view("outage", 60, 40.0),  # 60 s ago, but 60 s of it the scheduler was deaf
            "quiet": view("quiet", 60, 90.0),  # 60 s ago, 10 s of it deaf: silent 50 s
            "late": view("late", 15, 95.0),  # 15 s ago, 5 s of it deaf: silent 10 s
        }
    )
    listed = await call(nc, scheduler.NODE_LIST, Empty())
    got = {n: (h.state, round(h.silent_s)) for n, h in listed.health.items()}
    assert got == {"outage": ("ready", 0), "quiet": ("lost", 50), "late": ("suspect", 10)}
    later = time.time()  # the reply is the core's own judgment, not a copy of it
    for n, view_ in sched.nodes.items():
        assert health(view_, later, sched.hearing.deaf_s, sched.config.policy()).state == got[n][0]
    assert (listed.stale_s, listed.lost_s) == (2.0, 30.0)


def test_a_config_scoring_fewer_than_no_nodes_is_refused_naming_the_setting():
    with pytest.raises(msgspec.ValidationError, match=r"score_nodes"):
        msgspec.convert({"score_nodes": -1}, SchedulerConfig)
    assert msgspec.convert({"score_nodes": 0}, SchedulerConfig).policy().score_nodes == 0
