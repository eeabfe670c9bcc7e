"""Serving a mirrored file across real services over a real nats-server (each with its own
identity): a mirror holding a tiny GGUF (imported, verified), the catalog, a scheduler with CPU
nodes registered as agents would, and a router's admin API. The plan lists the CPU way, serve
writes the model, a very slow way is refused unless asked for on purpose; bad input leaves the
catalog untouched."""

import asyncio

import httpx
import pytest

from llmgw.bus import BadRequest, call
from llmgw.gguf import write_random_llama
from llmgw.proto import Empty, ModelRef, catalog, scheduler
from llmgw.proto.catalog import ServeModel, ServePlanAsk
from tests.fleets import SOURCE, cpu_node, serve_router

BY_HAND = "hand/placed/m.gguf"


class Fleet:
    def __init__(self, nc, url, admin, placer):
        self.nc, self.url, self.admin, self.placer = nc, url, admin, placer

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"{self.url}/api/v1", headers=self.admin, timeout=60)

    async def models(self) -> list[str]:
        return [e.model.name for e in (await call(self.nc, catalog.MODEL_LIST, Empty())).models]


@pytest.fixture
async def fleet(serve, nc, tmp_path):
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    write_random_llama(tmp_path / "mirror" / BY_HAND)
    served = await serve_router(serve, nc, tmp_path, tiny, scheduler=True)
    return Fleet(nc, served.router.http.url, {"authorization": f"Bearer {served.admin_key}"}, served.scheduler)


async def test_the_plan_lists_the_cpu_way_and_serve_writes_the_model(fleet):
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    plan = await call(fleet.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE, cores=2), timeout=30)
    [way] = plan.ways
    assert (way.kind, way.threads, way.node, way.nodes_fit, way.mark) == ("cpu", 2, "a", ["a"], "")
    assert way.tokens_per_s > 15 and way.more_replicas == 8192 // way.memory_mb
    assert way.memory_mb >= way.weights_mb + way.kv_mb > 0
    entry = await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, cores=2, by="t"), timeout=30)
    assert entry.warnings == [] and entry.changed_by == "t"
    stored = (await call(fleet.nc, catalog.MODEL_GET, ModelRef(name="tiny"))).model
    [profile] = stored.profiles
    assert (profile.name, profile.gpus, profile.cpu_cores, profile.host_memory_mb) == ("cpu", 0, 2, way.memory_mb)
    assert stored.source == SOURCE and stored.context == plan.context
    async with fleet.http() as http:
        shown = await http.get("/serve/plan", params={"source": SOURCE, "cores": 2})
        assert shown.status_code == 200, shown.text
        assert [w["kind"] for w in shown.json()["ways"]] == ["cpu"]
        again = await http.post("/serve", json={"source": SOURCE, "cpu": True})
        assert again.status_code == 409 and "already exists" in again.json()["error"]["message"], again.text
        named = await http.post("/serve", json={"source": SOURCE, "name": "tiny-2", "replicas": "cpu=2"})
        assert named.status_code == 201, named.text
        body = named.json()
        assert body["changed_by"] == "ops" and (body["model"]["scaling"]["min"], body["model"]["scaling"]["max"]) == (
            2,
            2,
        )


async def test_a_very_slow_cpu_way_is_refused_unless_it_is_asked_for_on_purpose(fleet):
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("slow", 0.0005))
    plan = await call(fleet.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE), timeout=30)
    [way] = plan.ways
    assert way.mark == "very slow" and way.node == "slow" and way.tokens_per_s < 5
    with pytest.raises(BadRequest) as refused:
        await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True), timeout=30)
    said = refused.value.message
    assert f"would answer at about {way.tokens_per_s:.1f} tokens a second on the CPU, at best on slow" in said
    assert "a reply of 500 tokens in about" in said and "--gpus 1" in said and "--cpu-anyway" in said
    assert await fleet.models() == []
    async with fleet.http() as http:
        posted = await http.post("/serve", json={"source": SOURCE})
        assert posted.status_code == 400 and "tokens a second on the CPU" in posted.json()["error"]["message"]
        taken = await http.post("/serve", json={"source": SOURCE, "cpu_anyway": True})
        assert taken.status_code == 201, taken.text
        assert taken.json()["warnings"][0].startswith("Very slow: about ")
    assert await fleet.models() == ["tiny"]


async def test_a_judge_is_served_on_a_cpu_too_slow_for_a_chat_model(fleet):
    """A judge reads a prompt and writes a few tokens: the very-slow gate does not hold it."""
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("slow", 0.0005))
    served = await call(
        fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, judge=True, name="guard"), timeout=30
    )
    assert served.model.judge and any(w.startswith("Very slow: about ") for w in served.warnings)
    assert any(w.startswith("no way gives a verdict within 1 s") for w in served.warnings)  # said, not refused


@pytest.mark.parametrize(
    ("ask", "said"),
    [
        pytest.param(
            ServeModel(source="demo/tiny/absent.gguf"),
            "`llmgw ctl mirror add OWNER/REPO` fetches it",
            id="a source the mirror does not hold",
        ),
        pytest.param(
            ServeModel(source=BY_HAND), "the mirror has not verified hand/placed/m.gguf", id="an unverified source"
        ),
        pytest.param(ServeModel(source=SOURCE, cores=64), "cores 64 is above every node's", id="cores no node has"),
        pytest.param(
            ServeModel(source=SOURCE, gpus=1), "--gpus 1: no node of this fleet has a card", id="gpus without cards"
        ),
        pytest.param(
            ServeModel(source=SOURCE, cpu=True, replicas="gpu=7,cpu=4"), "replicas: no profile gpu", id="bad replicas"
        ),
    ],
)
async def test_bad_input_is_refused_saying_what_to_write_and_the_catalog_is_untouched(fleet, ask, said):
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    with pytest.raises(BadRequest) as refused:
        await call(fleet.nc, catalog.SERVE, ask, timeout=30)
    assert said in refused.value.message
    assert await fleet.models() == []


async def test_a_files_facts_are_asked_once_and_the_scheduler_places_a_served_model_at_once(fleet, monkeypatch):
    """Two plans and a serve: the mirror reads the file's header once and answers each ask with
    its facts; the catalog reads no header and asks once a plan (the serve's put asks no more);
    the scheduler asks nothing, placing the model with what the catalog recorded. Before, a serve
    asked the mirror 3-4 times, the header was read 4-5 times across four services, and the
    scheduler's first pass could not place the model."""
    import llmgw.mirror.service as mirror_service
    from llmgw.proto import ModelStatusList

    reads, asks = [], []  # each ask of the mirror looks its file's hash up once (`known_digest` or `digest`)
    real_read, real_known, real_digest = mirror_service.read_header, mirror_service.known_digest, mirror_service.digest
    monkeypatch.setattr(mirror_service, "read_header", lambda path: reads.append(path) or real_read(path))
    monkeypatch.setattr(mirror_service, "known_digest", lambda path: asks.append(path.name) or real_known(path))
    monkeypatch.setattr(mirror_service, "digest", lambda path: asks.append(path.name) or real_digest(path))
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    first = await call(fleet.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE, cores=2))
    again = await call(fleet.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE, cores=1))
    assert first.ways and again.ways[0].threads == 1
    entry = await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, cores=2, by="t"))
    assert entry.file is not None and entry.file.facts is not None and entry.file.facts.shape.layers > 0
    for _ in range(100):  # the scheduler's passes after the serve: placed with the facts recorded
        statuses: ModelStatusList = await call(fleet.nc, scheduler.MODEL_STATUS, Empty())
        if any(s.model == "tiny" for s in statuses.models):
            break
        await asyncio.sleep(0.05)
    [status] = [s for s in statuses.models if s.model == "tiny"]
    assert "has not confirmed" not in status.reason, status
    assert fleet.placer.shapes[SOURCE] == entry.file.facts.shape
    assert (len(reads), asks) == (1, ["tiny.gguf"] * 3)


async def test_the_admin_api_removes_a_model_only_at_the_revision_it_names(fleet):
    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    entry = await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, by="t"), timeout=30)
    async with fleet.http() as http:
        stale = await http.delete("/models/tiny", params={"revision": entry.revision + 5})
        assert stale.status_code == 409, stale.text
        assert await fleet.models() == ["tiny"]
        bad = await http.delete("/models/tiny", params={"revision": -1})
        assert bad.status_code == 400 and "must be from 0" in bad.text
        removed = await http.delete("/models/tiny", params={"revision": entry.revision})
        assert removed.status_code == 200, removed.text
    assert await fleet.models() == []


async def test_a_context_change_is_held_to_the_rule_serve_holds_context_to(fleet):
    """`ctl model context smol 99999999` was taken while `serve --context 99999999` refused it;
    the replacement replica then failed at start for ever. One rule (the serve plan's) for both."""
    from llmgw.proto.catalog import SetContext

    await call(fleet.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    with pytest.raises(BadRequest) as served:
        await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, context=99_999_999), timeout=30)
    await call(fleet.nc, catalog.SERVE, ServeModel(source=SOURCE, cpu=True, by="t"), timeout=30)
    with pytest.raises(BadRequest) as changed:
        await call(fleet.nc, catalog.MODEL_CHANGE, SetContext(name="tiny", context=99_999_999, by="t"), timeout=30)
    assert changed.value.message == f"model 'tiny': {served.value.message}"
    assert "write --context" in changed.value.message
    assert (await call(fleet.nc, catalog.MODEL_GET, ModelRef(name="tiny"))).model.context != 99_999_999
    taken = await call(fleet.nc, catalog.MODEL_CHANGE, SetContext(name="tiny", context=1024, by="t"), timeout=30)
    assert taken.model.context == 1024
