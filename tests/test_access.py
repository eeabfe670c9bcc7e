"""NATS lets in only who belongs: a real nats-server with the configuration llmgw writes, each
role signed in with its own nkey, and the attacks a hostile tester made refused by the server."""

from __future__ import annotations

import asyncio
import os
import stat

import msgspec
import nats.micro
import pytest

from llmgw.bus import (
    BusConfig,
    BusError,
    Context,
    CredentialsError,
    call,
    connect,
    flushed,
    kv_bucket,
    new_identity,
    server_config,
    start_nats_server,
    write_identity,
)
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Empty,
    Heartbeat,
    KeyCreate,
    KeyCreated,
    Model,
    ModelList,
    NodeInfo,
    ReplicaReport,
    ReplicaSpec,
    ReplicaStart,
    ReplicaState,
    agent,
    catalog,
    router,
)
from tests.certs import certificates

NODES = ("a", "b")


@pytest.fixture
def secured(tmp_path):
    """A nats-server that lets in only llmgw's identities, and each identity's credentials file."""
    identities = [new_identity(r) for r in ("catalog", "scheduler", "mirror", "router", "ctl")]
    identities += [new_identity("agent", n) for n in NODES]
    creds = {}
    for identity in identities:
        creds[identity.user] = tmp_path / "creds" / f"{identity.user}.nk"
        write_identity(creds[identity.user], identity)
    conf = tmp_path / "nats.conf"
    conf.write_text(server_config(identities, tmp_path / "js"))
    server = start_nats_server(tmp_path / "nats", config=conf)
    yield server.url, creds
    server.stop()


async def _as(url, creds, user):
    return await connect(url, f"test-{user}", creds=str(creds[user]))


async def _refused(attempt, timeout=2.0):
    """The server drops what a role may not publish: a request gets no answer, a write no ack."""
    with pytest.raises((BusError, nats.errors.Error, asyncio.TimeoutError, TimeoutError)):
        await asyncio.wait_for(attempt, timeout)


def test_credentials_files_are_readable_by_their_owner_alone(secured):
    _, creds = secured
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in creds.values())


async def test_a_client_without_credentials_is_refused_saying_what_to_give(secured):
    url, _ = secured
    with pytest.raises(CredentialsError, match=r"refused a client without credentials \(give --creds FILE\)"):
        await connect(url, "anonymous", patient=False)


async def test_unknown_damaged_or_missing_credentials_are_refused_naming_the_file(secured, tmp_path):
    url, _ = secured
    stranger = tmp_path / "stranger.nk"
    write_identity(stranger, new_identity("router"))
    with pytest.raises(CredentialsError, match=f"refused the credentials in {stranger}"):
        await connect(url, "stranger", patient=False, creds=str(stranger))
    damaged = tmp_path / "damaged.nk"
    damaged.write_text("SUAAAA\n")
    with pytest.raises(CredentialsError, match=f"credentials {damaged}: the seed does not decode"):
        await connect(url, "damaged", patient=False, creds=str(damaged))
    with pytest.raises(CredentialsError, match=f"credentials {tmp_path / 'none.nk'}: No such file"):
        await connect(url, "missing", patient=False, creds=str(tmp_path / "none.nk"))


async def test_an_agent_cannot_write_the_catalog_or_replicas_nor_read_the_keys(secured):
    url, creds = secured
    owner = await _as(url, creds, "catalog")
    intruder = await _as(url, creds, "agent-a")
    try:
        catalog_kv = await kv_bucket(owner.jetstream(), BUCKETS["catalog"])
        forged = CatalogRecord(model=Model(name="m", source="o/r/m.gguf"))
        await _refused(intruder.jetstream().key_value(BUCKETS["catalog"]))
        await _refused(_put(intruder, BUCKETS["catalog"], "m", forged))
        await _refused(
            _put(intruder, BUCKETS["replicas"], "r1", ReplicaState(id="r1", model="m", profile="p", node="a"))
        )
        await _refused(intruder.jetstream().key_value(BUCKETS["keys"]))
        assert not await _any(catalog_kv), "the forged model reached the catalog"
    finally:
        await intruder.close()
        await owner.close()


async def _put(nc, bucket, key, value):
    await nc.jetstream().publish(f"$KV.{bucket}.{key}", msgspec.json.encode(value), timeout=1.0)


async def _any(kv) -> bool:
    try:
        return bool(await kv.keys())
    except Exception:
        return False


async def test_an_agent_can_speak_only_for_its_own_node(secured):
    url, creds = secured
    scheduler = await _as(url, creds, "scheduler")
    a = await _as(url, creds, "agent-a")
    try:
        beats = await scheduler.subscribe(agent.HEARTBEAT.all)
        events = await scheduler.subscribe(agent.REPLICA_CHANGED.all)
        await flushed(scheduler)  # its interest is on the server before the agent speaks
        info = NodeInfo(node="b", hostname="h", cpus=1, memory_total_mb=1, memory_available_mb=1)
        report = ReplicaReport(id="r1", model="m", profile="p", node="b", state="ready", url="http://evil:1")
        await a.publish(agent.HEARTBEAT.subject("b"), msgspec.json.encode(Heartbeat(info=info)))
        await a.publish(agent.REPLICA_CHANGED.subject("b", "r1"), msgspec.json.encode(report))
        await a.publish(agent.HEARTBEAT.subject("a"), msgspec.json.encode(Heartbeat(info=info)))
        await flushed(a)
        got = await beats.next_msg(timeout=10)
        assert got.subject == agent.HEARTBEAT.subject("a")
        with pytest.raises(nats.errors.TimeoutError):
            await beats.next_msg(timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await events.next_msg(timeout=0.5)
    finally:
        await a.close()
        await scheduler.close()


async def _answered(ask, within=5.0):
    """What `ask()` (a call) answers, asked again while nobody answers yet (a new endpoint's
    interest can take a moment to reach the server from another connection), for `within` s."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await ask()
        except BusError as exc:
            if "nobody answers" not in exc.message or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _serve(nc, endpoint, handler, node=""):
    """An endpoint served on `nc`, as the service that owns it serves it."""
    service = await nats.micro.add_service(nc, name=f"llmgw-{endpoint.service}", version="0.0.1")

    class _App:
        name, version, description = endpoint.service, "0", "test"

    ctx = Context(_App(), BusConfig(node=node or "n"), nc, service)
    await ctx.serve(endpoint, handler, node=node)
    await flushed(nc)  # the server knows of the endpoint before another connection asks it
    return service


async def test_only_the_scheduler_can_start_an_engine_and_only_the_operator_can_mint_a_key(secured):
    url, creds = secured
    node_a = await _as(url, creds, "agent-a")
    routing = await _as(url, creds, "router")
    ops = await _as(url, creds, "ctl")
    scheduling = await _as(url, creds, "scheduler")
    started = []

    async def start(req: ReplicaStart) -> ReplicaReport:
        started.append(req.replica.id)
        return ReplicaReport(id=req.replica.id, model="m", profile="p", node="a", state="starting")

    async def mint(req: KeyCreate) -> KeyCreated:
        return KeyCreated(name=req.name, key="sk-new")

    try:
        await _serve(node_a, agent.REPLICA_START, start, node="a")
        await _serve(routing, router.KEY_CREATE, mint)
        model = Model(name="m", source="o/r/m.gguf")
        ask = ReplicaStart(replica=_spec(), model=model, profile=model.profiles[0])
        await _refused(call(routing, agent.REPLICA_START, ask, node="a", timeout=1))
        await _refused(call(node_a, router.KEY_CREATE, KeyCreate(name="x", admin=True), timeout=1))
        assert started == []
        assert (await _answered(lambda: call(scheduling, agent.REPLICA_START, ask, node="a"))).state == "starting"
        assert (await _answered(lambda: call(ops, router.KEY_CREATE, KeyCreate(name="ops")))).key == "sk-new"
    finally:
        for nc in (node_a, routing, ops, scheduling):
            await nc.close()


def _spec():
    return ReplicaSpec(id="r1", model="m", profile="p", node="a")


async def test_the_operator_can_ask_the_catalog_but_an_agent_cannot(secured):
    url, creds = secured
    owner = await _as(url, creds, "catalog")
    ops = await _as(url, creds, "ctl")
    intruder = await _as(url, creds, "agent-b")

    async def listing(_: Empty) -> ModelList:
        return ModelList(models=[])

    try:
        await _serve(owner, catalog.MODEL_LIST, listing)
        assert await _answered(lambda: call(ops, catalog.MODEL_LIST, Empty())) == ModelList(models=[])
        await _refused(call(intruder, catalog.MODEL_LIST, Empty(), timeout=1))
    finally:
        for nc in (owner, ops, intruder):
            await nc.close()


def _tls_server(tmp_path, tls):
    ops = new_identity("ctl")
    write_identity(tmp_path / "ctl.nk", ops)
    conf = tmp_path / "tls.conf"
    conf.write_text(server_config([ops], tmp_path / "js", tls=tls))
    return start_nats_server(tmp_path / "nats", config=conf), str(tmp_path / "ctl.nk")


async def test_with_tls_a_client_that_trusts_the_ca_gets_in_and_one_without_it_is_told_why(tmp_path):
    tls = certificates(tmp_path / "tls")
    server, creds = _tls_server(tmp_path, tls)
    try:
        nc = await connect(server.url, "tls", patient=False, creds=creds, tls_ca=tls.ca)
        assert nc.is_connected
        await nc.close()
        with pytest.raises(CredentialsError, match="TLS"):
            await connect(server.url, "plain", patient=False, creds=creds)
        with pytest.raises(CredentialsError, match=f"TLS CA {tmp_path / 'nope.pem'}"):
            await connect(server.url, "nope", patient=False, creds=creds, tls_ca=str(tmp_path / "nope.pem"))
    finally:
        server.stop()


async def test_an_expired_server_certificate_is_refused_saying_so(tmp_path):
    tls = certificates(tmp_path / "tls", expired=True)
    server, creds = _tls_server(tmp_path, tls)
    try:
        with pytest.raises(CredentialsError, match="certificate has expired"):
            await connect(server.url, "late", patient=True, creds=creds, tls_ca=tls.ca)
    finally:
        server.stop()


async def test_only_the_catalog_may_delete_a_mirrors_file_and_an_agent_may_not_purge_or_collect(secured):
    from llmgw.proto import ModelPurge, WeightsCollect, WeightsDelete, WeightsDeleted, mirror

    url, creds = secured
    mirroring = await _as(url, creds, "mirror")
    owner = await _as(url, creds, "catalog")
    intruder = await _as(url, creds, "agent-a")
    routing = await _as(url, creds, "router")
    deleted = []

    async def delete(req: WeightsDelete) -> WeightsDeleted:
        deleted.extend(req.sources)
        return WeightsDeleted(where="mirror", deleted=req.sources)

    try:
        await _serve(mirroring, mirror.FILE_DELETE, delete)
        ask = WeightsDelete(sources=["o/r/m.gguf"])
        await _refused(call(intruder, mirror.FILE_DELETE, ask, timeout=1))
        await _refused(call(routing, mirror.FILE_DELETE, ask, timeout=1))
        await _refused(call(intruder, catalog.MODEL_PURGE, ModelPurge(name="m"), timeout=1))
        await _refused(call(routing, agent.WEIGHTS_COLLECT, WeightsCollect(keep=[]), timeout=1))
        assert deleted == []
        assert (await _answered(lambda: call(owner, mirror.FILE_DELETE, ask))).deleted == ["o/r/m.gguf"]
    finally:
        for nc in (mirroring, owner, intruder, routing):
            await nc.close()
