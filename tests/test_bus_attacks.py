"""The bus attacks of issue 31, made with the real identities on a real nats-server and the real
services: a push consumer that delivers a bucket's values on an agent's start and stop subjects,
an agent registering another node, and a reply subject naming somebody else's subject. Each was
seen to work; each is refused now, and the flows that must work still do."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from structlog.testing import capture_logs

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import (
    BadRequest,
    BusError,
    Signer,
    call,
    connect,
    flushed,
    kv_bucket,
    read_identity,
    request_raw,
)
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.gguf import write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import (
    BUCKETS,
    Empty,
    Model,
    ModelPut,
    NodeInfo,
    Profile,
    ReplicaSpec,
    ReplicaStart,
    ReplicaStop,
    Scaling,
    agent,
    catalog,
    scheduler,
)
from llmgw.scheduler.service import Scheduler, SchedulerConfig

SOURCE = "test/tiny/m.gguf"
MODEL = Model(name="m", source=SOURCE, context=512)
WRITES = {"router": "demand", "catalog": "catalog", "scheduler": "replicas"}
"""A bucket each role may write (and so read), whose values it can have delivered elsewhere."""


async def _as(nats_server, role, node=""):
    return await connect(nats_server.url, f"test-{role}", creds=nats_server.creds(role, node))


def _start(rid):
    spec = ReplicaSpec(id=rid, model=MODEL.name, profile="cpu", node="a")
    return ReplicaStart(replica=spec, model=MODEL, profile=Profile(name="cpu", slots=1))


@pytest.fixture
async def node_a(serve, nats_server, tmp_path):
    """A mirror with a tiny model, and the real agent of node 'a' checking the scheduler's key."""
    write_random_llama(tmp_path / "mirror" / SOURCE)
    await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    scheduler_key = read_identity(nats_server.creds("scheduler")).public
    config = AgentConfig(
        node="a",
        data_dir=str(tmp_path / "a"),
        heartbeat_s=60,
        membw_delay_max_s=3600,
        ports="21200-21299",
        scheduler_key=scheduler_key,
    )
    return await serve(Agent(config), config)


@pytest.fixture
async def scheduling(nats_server):
    """The scheduler's identity, and what signs as it."""
    conn = await _as(nats_server, "scheduler")
    yield conn, Signer.from_creds(nats_server.creds("scheduler"))
    await conn.close()


async def _ready(node, rid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = node.replicas.runs.get(rid)
        if run and run.report.state in ("ready", "failed"):
            return run.report
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica {rid} never became ready")


async def _deliver(conn, bucket, key, payload, subject):
    """The attack: `payload` put in `bucket` (one `conn` may write), and a push consumer on its
    stream, made by `conn`, that delivers it on `subject` (the agents' queue group as its group)."""
    js = conn.jetstream()
    await js.publish(f"$KV.{bucket}.{key}", msgspec.json.encode(payload), timeout=5)
    await js.add_consumer(
        f"KV_{bucket}",
        ConsumerConfig(
            name=f"attack-{key}",
            deliver_subject=subject,
            deliver_group="q",
            filter_subject=f"$KV.{bucket}.{key}",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
        ),
        timeout=5,
    )


@pytest.mark.parametrize("role", ["router", "catalog", "scheduler"])
async def test_no_role_can_start_or_stop_an_engine_by_a_consumer_delivering_on_an_agents_subject(
    role, node_a, scheduling, nats_server, nc
):
    conn, signer = scheduling
    await call(conn, agent.REPLICA_START, _start("r1"), node="a", signer=signer)
    assert (await _ready(node_a, "r1")).state == "ready"
    bucket = BUCKETS[WRITES[role]]
    await kv_bucket(nc.jetstream(), bucket)  # as its owner made it
    seen = await nc.subscribe(f"{agent.REPLICA_START.group('a')}.>")  # the harness sees what is delivered there
    await flushed(nc)
    attacker = await _as(nats_server, role)
    try:
        await _deliver(attacker, bucket, "x-start", _start("rogue"), agent.REPLICA_START.subject("a"))
        await _deliver(
            attacker, bucket, "x-stop", ReplicaStop(id="r1", reason="attack"), agent.REPLICA_STOP.subject("a")
        )
        delivered = {(await seen.next_msg(timeout=10)).subject for _ in range(2)}  # routed on the agent's subjects,
        assert delivered == {f"$KV.{bucket}.x-start", f"$KV.{bucket}.x-stop"}  # named by the stream's
        await asyncio.sleep(1.0)  # time enough for the agent to have acted, had it
        assert "rogue" not in node_a.replicas.runs, f"the {role}'s identity started an engine"
        assert node_a.replicas.runs["r1"].report.state == "ready", f"the {role}'s identity stopped an engine"
        metrics = node_a.ctx.metrics
        for endpoint in (agent.REPLICA_START, agent.REPLICA_STOP):
            labels = {"subject": endpoint.subject("a"), "code": "not_inbox"}
            assert metrics.get_sample_value("llmgw_requests_total", labels) >= 1, "delivered, and refused"
    finally:
        await attacker.close()


async def test_the_schedulers_signed_start_runs_and_a_replay_an_old_a_moved_or_a_foreign_signature_does_not(
    node_a, scheduling, nats_server
):
    conn, signer = scheduling
    report = await call(conn, agent.REPLICA_START, _start("r1"), node="a", signer=signer)
    assert report.id == "r1"
    subject = agent.REPLICA_START.subject("a")
    data = msgspec.json.encode(_start("r2"))
    fresh = signer.headers(subject, data, time.time())
    other = Signer(read_identity(nats_server.creds("router")).seed)
    refusals = {
        "unsigned": (None, "not signed; only the scheduler may ask it"),
        "replayed": (fresh, "seen before: replayed"),
        "old": (signer.headers(subject, data, time.time() - 300), "more than 120 s"),
        "for node b": (signer.headers(agent.REPLICA_START.subject("b"), data, time.time()), "not signed by"),
        "changed": (signer.headers(subject, msgspec.json.encode(_start("r3")), time.time()), "not signed by"),
        "another key": (other.headers(subject, data, time.time()), "not signed by the scheduler's key"),
    }
    first = await request_raw(conn, subject, data, timeout=10, headers=fresh)
    assert "Nats-Service-Error-Code" not in (first.headers or {}), "signed rightly: run"
    with capture_logs() as logs:
        for why, (headers, says) in refusals.items():
            reply = await request_raw(conn, subject, data, timeout=10, headers=headers)
            error = (reply.headers or {}).get("Nats-Service-Error", "")
            assert reply.headers["Nats-Service-Error-Code"] == "400" and says in error, (why, error)
    refused = [e for e in logs if e["event"] == "request refused: not signed rightly"]
    assert len(refused) == len(refusals) and all(e["subject"] == subject for e in refused)
    assert sorted(node_a.replicas.runs) == ["r1", "r2"], "only what the scheduler signed, once"
    await call(conn, agent.REPLICA_STOP, ReplicaStop(id="r1"), node="a", signer=signer)
    assert "r1" not in node_a.replicas.runs
    with pytest.raises(BadRequest, match="not signed"):
        await call(conn, agent.REPLICA_STOP, ReplicaStop(id="r2"), node="a")
    assert "r2" in node_a.replicas.runs


async def test_the_real_scheduler_signs_what_it_asks_and_the_agent_that_checks_runs_it(
    serve, nats_server, tmp_path, nc
):
    write_random_llama(tmp_path / "mirror" / SOURCE)
    await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    config = SchedulerConfig(tick_s=0.3, creds=nats_server.creds("scheduler"))
    await serve(Scheduler(config), config)
    agent_config = AgentConfig(
        node="a",
        data_dir=str(tmp_path / "a"),
        heartbeat_s=0.5,
        membw_delay_max_s=3600,
        ports="21300-21399",
        scheduler_key=read_identity(nats_server.creds("scheduler")).public,
    )
    node = await serve(Agent(agent_config), agent_config)
    put = ModelPut(model=Model(name="m", source=SOURCE, context=512, scaling=Scaling(min=1, max=1)))
    await call(nc, catalog.MODEL_PUT, put)
    deadline = time.monotonic() + 60
    while not any(r.report.state == "ready" for r in node.replicas.runs.values()):
        assert time.monotonic() < deadline, "the scheduler's signed start never ran"
        await asyncio.sleep(0.2)


def _info(node):
    return NodeInfo(node=node, hostname="ghost", cpus=4096, memory_total_mb=10_000_000, memory_available_mb=1)


async def test_an_agent_registers_its_own_node_and_no_other(serve, nats_server, nc):
    config = SchedulerConfig()
    await serve(Scheduler(config), config)
    a = await _as(nats_server, "agent", "a")
    try:
        await call(a, scheduler.NODE_REGISTER, _info("a"))  # its own: the subject names it
        with pytest.raises((BusError, nats.errors.Error, TimeoutError)):  # node b's subject: the server drops it
            await call(a, scheduler.NODE_REGISTER, _info("b"), timeout=1)
        with pytest.raises(BadRequest, match="names node 'b': a node speaks only for itself"):
            await call(a, scheduler.NODE_REGISTER, _info("b"), node="a")  # its own subject, another node named
        with pytest.raises((BusError, nats.errors.Error, TimeoutError)):  # the subject without a node
            await request_raw(a, f"{scheduler.NODE_REGISTER.group()}.node.register", msgspec.json.encode(_info("b")), 1)
        nodes = (await call(nc, scheduler.NODE_LIST, Empty())).nodes
        assert [n.node for n in nodes] == ["a"], "a ghost node registered"
    finally:
        await a.close()


async def test_a_service_answers_only_on_an_inbox_never_on_a_subject_the_asker_names(serve, nats_server, nc):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    injected = agent.HEARTBEAT.subject("zz-injected")
    heard = await nc.subscribe(agent.HEARTBEAT.all)
    await flushed(nc)
    mirroring, ops = await _as(nats_server, "mirror"), await _as(nats_server, "ctl")
    try:
        assert (await call(mirroring, catalog.MODEL_LIST, Empty())).models == []  # an inbox: answered
        with capture_logs() as logs:
            for _ in range(20):
                await mirroring.publish(catalog.MODEL_LIST.subject(), b"{}", reply=injected)
            for verb in ("PING", "INFO", "STATS"):  # nats.micro's discovery, which only the operator asks
                await ops.publish(f"$SRV.{verb}", b"", reply=injected)
            await flushed(mirroring)
            await flushed(ops)
            with pytest.raises(nats.errors.TimeoutError):
                await heard.next_msg(timeout=1.0)
        refused = [e for e in logs if e["event"] == "request whose reply subject is not an inbox refused"]
        assert len(refused) == 1 and refused[0]["reply"] == injected, "said once, not once a message"
        assert (await call(mirroring, catalog.MODEL_LIST, Empty())).models == []  # and it carries on
    finally:
        await mirroring.close()
        await ops.close()
