"""The scheduler over real NATS with several agents on one machine (each its own node name and
connection), real llama-servers, and two schedulers of which one leads.

"Killed" here is what a crash leaves: the service's tasks end and its NATS connection drops,
with nothing released; an agent's engines die with it (its node crashed), or serve on (the
agent alone was killed: the next one adopts them).
"""

import asyncio
import os
import signal
import time

import httpx
import msgspec
import pytest

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import call
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, Model, ModelPut, Profile, Scaling, catalog, scheduler
from llmgw.proto import agent as agent_api
from llmgw.proto.catalog import SetReplicas
from llmgw.scheduler.service import Scheduler, SchedulerConfig

SOURCE = "test/tiny/m.gguf"


class Cluster:
    """Services each on their own NATS connection, so one can be killed alone."""

    def __init__(self, nats):
        self.nats, self.running = nats, []

    async def add(self, app, config):
        self.running.append((app, *await self.nats.start(app, config)))
        return app

    async def kill(self, app, engines=True):
        """As a crash of its node would (an agent's engines and workers die with it), or of the
        agent alone (`engines` False: they serve on, for the next agent to adopt)."""
        for t in getattr(app, "tasks", []):
            t.cancel()
        for run in getattr(getattr(app, "replicas", None), "runs", {}).values():
            if run.task:
                run.task.cancel()
        supervisor = getattr(app, "supervisor", None)
        for child in list(supervisor.children.values()) if supervisor else []:
            for task in (child.watch, child.pump):
                if task:
                    task.cancel()
            if engines and child.proc.returncode is None:
                os.killpg(child.proc.pid, signal.SIGKILL)
        entry = next(e for e in self.running if e[0] is app)
        self.running.remove(entry)
        await entry[2].close()

    async def close(self):
        for app, service, nc in reversed(self.running):
            await app.stop()
            await service.stop()
            await nc.close()


@pytest.fixture
async def cluster(nats_server, tmp_path):
    c = Cluster(nats_server)
    write_random_llama(tmp_path / "mirror" / SOURCE)
    await c.add(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    await c.add(Catalog(CatalogConfig()), CatalogConfig())
    yield c
    await c.close()


async def agent(cluster, tmp_path, name, port, **labels):
    config = AgentConfig(
        node=name,
        data_dir=str(tmp_path / name),
        heartbeat_s=0.5,
        membw_delay_max_s=3600,
        ports=f"{port}-{port + 99}",
        labels=labels,
    )
    return await cluster.add(Agent(config), config)


def scheduler_config():
    return SchedulerConfig(tick_s=0.3, stale_s=2.0, lost_s=4.0, lease_s=3.0)


async def replicas(nc):
    return [r for r in (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas if r.model == "m"]


async def until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await predicate()
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError("never happened")


async def test_a_killed_agents_replicas_are_replaced_on_another_node(cluster, nc, tmp_path):
    await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    a = await agent(cluster, tmp_path, "a", 22000)
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1))),
    )
    first = await until(lambda: _ready(nc))
    assert [r.node for r in first] == ["a"]
    b = await agent(cluster, tmp_path, "b", 22100)
    await cluster.kill(a)
    moved = await until(lambda: _ready(nc, node="b"))
    assert len(moved) == 1 and moved[0].id != first[0].id
    assert b.replicas.runs[moved[0].id].report.state == "ready"


async def test_a_standby_takes_over_from_a_dead_leader_and_adopts_what_runs(cluster, nc, tmp_path):
    leader = await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    await until(lambda: _true(leader.leader))
    standby = await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    a = await agent(cluster, tmp_path, "a", 22200)
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1))),
    )
    [running] = await until(lambda: _ready(nc))
    assert not standby.leader
    await cluster.kill(leader)
    took = time.monotonic()
    await until(lambda: _true(standby.leader), timeout=20)
    assert time.monotonic() - took < 10  # within a few seconds of the leader's death
    await asyncio.sleep(2)  # a few passes of the new leader
    assert [r.id for r in await replicas(nc)] == [running.id]  # adopted: nothing started twice
    assert list(a.replicas.runs) == [running.id]
    entry = await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=2, max=2))),
    )
    assert entry.model.scaling.min == 2
    both = await until(lambda: _ready(nc, count=2))
    assert running.id in {r.id for r in both}


async def test_a_replica_across_two_nodes_of_one_rack_answers_and_is_replaced_when_its_worker_dies(
    cluster, nc, tmp_path
):
    await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    agents = {
        name: await agent(cluster, tmp_path, name, port, rack=rack)
        for name, port, rack in (("a", 22300, "r1"), ("b", 22400, "r1"), ("c", 22500, "r2"))
    }
    profile = Profile(name="rpc", nodes=2, keep_within="rack", startup_timeout_s=60)
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, profiles=[profile], scaling=Scaling(min=1, max=1))),
    )
    [first] = await until(lambda: _ready(nc))
    (worker,) = first.workers
    assert {first.node, worker.node} == {"a", "b"}  # c is alone in its rack
    assert worker.endpoint.startswith("127.0.0.1:224" if worker.node == "b" else "127.0.0.1:223")
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(
            f"{first.url}/v1/completions",
            json={"prompt": "hello", "max_tokens": 4, "ignore_eos": True},
            headers={"authorization": f"Bearer {agents[first.node].replicas.keys.key(first.node, first.id)}"},
        )
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    serving = agents[worker.node].supervisor.children[f"{first.id}.worker"]
    assert any("Accepted client connection" in line for line in serving.tail)  # the engine drives it
    os.killpg(serving.proc.pid, signal.SIGKILL)
    [second] = await until(lambda: _ready_other_than(nc, first.id), timeout=90)
    assert {second.node, second.workers[0].node} == {"a", "b"}
    assert first.id not in agents[first.node].replicas.runs and first.id not in agents[worker.node].workers.ids()


async def _ready_other_than(nc, rid):
    ready = [r for r in await replicas(nc) if r.state == "ready" and r.id != rid]
    return ready or None


async def _true(value):
    return value


async def _ready(nc, node=None, count=1):
    ready = [r for r in await replicas(nc) if r.state == "ready" and (node is None or r.node == node)]
    return ready if len(ready) >= count else None


async def test_a_stopped_replica_drains_before_its_engine_stops(cluster, nc, tmp_path):
    config = msgspec.structs.replace(scheduler_config(), drain_s=2.0)
    await cluster.add(Scheduler(config), config)
    a = await agent(cluster, tmp_path, "a", 22300)
    model = Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1))
    await call(nc, catalog.MODEL_PUT, ModelPut(model=model))
    [running] = await until(lambda: _ready(nc))
    stopped = msgspec.structs.replace(model, scaling=Scaling(min=0, max=0))
    await call(nc, catalog.MODEL_PUT, ModelPut(model=stopped))
    [draining] = await until(lambda: _in_state(nc, "draining"))
    assert (
        draining.id == running.id and a.replicas.runs[running.id].report.state == "ready"
    )  # still serving its requests
    await until(lambda: _none_left(nc), timeout=15)
    assert running.id not in a.replicas.runs


async def _in_state(nc, state):
    return [r for r in await replicas(nc) if r.state == state] or None


async def _none_left(nc):
    return not await replicas(nc)


async def test_a_change_of_split_never_runs_fewer_ready_replicas(cluster, nc, tmp_path):
    await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    await agent(cluster, tmp_path, "a", 22400, pool="one")
    await agent(cluster, tmp_path, "b", 22500, pool="two")
    one = Profile(name="one", node_selector={"pool": "one"}, replicas=2, host_memory_mb=256, priority=1)
    two = Profile(name="two", node_selector={"pool": "two"}, replicas=1, host_memory_mb=256)
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=3, max=3), profiles=[one, two])),
    )
    await until(lambda: _ready(nc, count=3), timeout=120)
    await call(nc, catalog.MODEL_CHANGE, SetReplicas(name="m", counts={"one": 1, "two": 2}))
    fewest = 3
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = await replicas(nc)
        ready = [r for r in now if r.state == "ready"]
        fewest = min(fewest, len(ready))
        if sorted(r.node for r in ready) == ["a", "b", "b"] and len(now) == 3:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"the split never became 1+2: {[(r.node, r.state) for r in now]}")
    assert fewest >= 3


async def test_a_nats_outage_longer_than_lost_s_replaces_and_drains_nothing(cluster, nc, nats_server, tmp_path):
    from llmgw.bus import start_nats_server

    config = msgspec.structs.replace(scheduler_config(), stale_s=1.0, lost_s=3.0)
    leader = await cluster.add(Scheduler(config), config)
    agents = [await agent(cluster, tmp_path, name, port) for name, port in (("a", 22600), ("b", 22700))]
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=2, max=2))),
    )
    before = await until(lambda: _ready(nc, count=2), timeout=90)
    pids = {rid: run.child.pid for a in agents for rid, run in a.replicas.runs.items()}
    nats_server.stop()
    away = 6.0  # twice lost_s
    await asyncio.sleep(away)
    back = start_nats_server(tmp_path / "nats", port=nats_server.port)
    nats_server.process = back.process  # stopped by the fixture
    await until(lambda: _true(leader.leader and nc.is_connected), timeout=30)
    seen, deadline = [], time.monotonic() + 3 * config.lost_s  # long enough for any pass to act on it
    while time.monotonic() < deadline:
        try:
            now = await replicas(nc)
        except Exception:  # the bus is still coming back
            await asyncio.sleep(0.2)
            continue
        seen.append(sorted((r.id, r.state) for r in now))
        await asyncio.sleep(0.2)
    after = {rid: run.child.pid for a in agents for rid, run in a.replicas.runs.items() if run.child}
    states = sorted({s for snapshot in seen for _, s in snapshot})
    print(f"NATS away {away:g}s (lost_s {config.lost_s:g}s): {len(seen)} listings after, states seen {states}")
    assert seen and all(snapshot == sorted((r.id, "ready") for r in before) for snapshot in seen)
    assert after == pids  # the same engines, none started or stopped


async def test_an_agent_restarted_after_a_hard_kill_keeps_its_replica_its_engine_serving_on(cluster, nc, tmp_path):
    config = scheduler_config()
    await cluster.add(Scheduler(config), config)
    a = await agent(cluster, tmp_path, "a", 22800)
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1))),
    )
    [running] = await until(lambda: _ready(nc))
    pid = a.replicas.runs[running.id].child.pid
    await cluster.kill(a, engines=False)
    await asyncio.sleep(1.0)
    again = await agent(cluster, tmp_path, "a", 22800)
    assert again.replicas.runs[running.id].report.state == "ready" and again.supervisor.pids() == {pid}
    deadline, seen = time.monotonic() + 2 * config.lost_s, set()
    while time.monotonic() < deadline:
        seen.add(tuple(sorted((r.id, r.state) for r in await replicas(nc))))
        await asyncio.sleep(0.2)
    print(f"agent killed hard and restarted: listings seen {sorted(seen)}, engine {pid} adopted")
    assert seen == {((running.id, "ready"),)} and again.supervisor.pids() == {pid}


async def test_an_engine_replaced_while_its_agent_was_away_is_stopped_when_the_agent_returns(cluster, nc, tmp_path):
    import psutil

    config = scheduler_config()
    await cluster.add(Scheduler(config), config)
    ports = {"a": 22900, "b": 23000}
    agents = {name: await agent(cluster, tmp_path, name, port) for name, port in ports.items()}
    await call(
        nc,
        catalog.MODEL_PUT,
        ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1))),
    )
    [first] = await until(lambda: _ready(nc))
    engine = psutil.Process(agents[first.node].replicas.runs[first.id].child.pid)
    await cluster.kill(agents[first.node], engines=False)
    [moved] = await until(lambda: _ready_other_than(nc, first.id), timeout=60)
    assert moved.node != first.node and engine.is_running()  # its engine serves on, unknown to all
    back = await agent(cluster, tmp_path, first.node, ports[first.node])  # adopts it, reports it
    await until(lambda: _true(first.id not in back.replicas.runs), timeout=30)  # stopped: no duplicate
    assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE  # no orphan (reaped by its parent)
    assert [r.id for r in await replicas(nc)] == [moved.id]


async def test_a_file_that_fits_a_node_but_whose_context_does_not_is_parked_with_the_numbers_never_started(
    cluster, nc, tmp_path
):
    long = "test/tiny/long.gguf"  # trained for 2**30 tokens: 256 GiB of f16 KV at that context, the file a few MB
    write_random_llama(tmp_path / "mirror" / long, TinyLlama(context=2**30))
    starts = []

    async def noted(msg):
        starts.append(msg.subject)

    await nc.subscribe(agent_api.REPLICA_START.subject("a"), cb=noted)
    await cluster.add(Scheduler(scheduler_config()), scheduler_config())
    await agent(cluster, tmp_path, "a", 22900)
    model = Model(name="m", source=long, context=2**30, profiles=[Profile(slots=1)], scaling=Scaling(min=1, max=1))
    await call(nc, catalog.MODEL_PUT, ModelPut(model=model))

    async def parked():
        statuses = (await call(nc, scheduler.MODEL_STATUS, Empty())).models
        return next((s for s in statuses if s.model == "m" and s.state == "parked" and "a: memory" in s.reason), None)

    status = await until(parked, timeout=30)
    assert "a: memory: needs " in status.reason and " MiB free" in status.reason
    assert "KV 262144 MiB for a context of 1073741824 in 1 slots" in status.reason  # read from the mirror's header
    assert "a context of " in status.reason.split("MiB free", 1)[1]  # and what would fit this node
    await asyncio.sleep(1.0)  # a few more passes
    assert starts == [] and await replicas(nc) == []
