"""Operators' operations written once: each endpoint whose proto entry names an admin route is on
the admin API (with its OpenAPI), answers what `llmgw.bus.call` answers, and a service's refusal
comes back the same way on every face. A real router, catalog, mirror and scheduler over a real
nats-server."""

import httpx
import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import Empty, catalog, mirror, router, scheduler
from llmgw.router.errors import refused
from tests.fleets import SOURCE, serve_router

OPERATOR_ENDPOINTS = (*catalog.ENDPOINTS, *mirror.ENDPOINTS, *scheduler.ENDPOINTS, *router.ENDPOINTS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("w") / "tiny.gguf")


@pytest.fixture
async def served(serve, nc, tmp_path, tiny):
    return await serve_router(serve, nc, tmp_path, tiny, scheduler=True)


def _http(served) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {served.admin_key}"}
    return httpx.AsyncClient(base_url=f"{served.router.http.url}/api/v1", headers=headers, timeout=60)


async def test_every_endpoint_with_an_admin_route_is_on_the_admin_api_with_its_summary(served):
    async with _http(served) as http:
        schema = (await http.get(f"{served.router.http.url}/schema/openapi.json")).json()
    paths = schema["paths"]
    routed = [e for e in OPERATOR_ENDPOINTS if e.admin is not None]
    assert len(routed) >= 12
    for endpoint in routed:
        path = "/api/v1" + endpoint.admin.path
        operation = paths.get(path, {}).get(endpoint.admin.method.lower())
        assert operation is not None, f"{endpoint.service}.{endpoint.name}: no {endpoint.admin.method} {path}"
        assert operation["summary"] == endpoint.doc
        assert str(endpoint.admin.status) in operation["responses"]


async def test_a_route_answers_what_the_endpoint_answers(served, nc):
    """The fleet's lists, added by one line each in proto, answer as the scheduler does."""
    async with _http(served) as http:
        for endpoint, path in (
            (scheduler.NODE_LIST, "/fleet/nodes"),
            (scheduler.REPLICA_LIST, "/fleet/replicas"),
            (scheduler.MODEL_STATUS, "/fleet/models"),
            (catalog.MODEL_LIST, "/models"),
            (mirror.REPO_LIST, "/mirror"),
        ):
            got = await http.get(path)
            assert got.status_code == 200, (path, got.text)
            want = await call(nc, endpoint, Empty())
            assert got.json().keys() == {f for f in want.__struct_fields__}, path


async def test_refusals_keep_their_meaning_and_name_what_was_wrong(served):
    async with _http(served) as http:
        missing = await http.get("/models/nothing")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "catalog_404", missing.text
        assert "nothing" in missing.json()["error"]["message"]
        room = await http.get("/fleet/models/nothing/room")
        assert room.status_code == 404 and room.json()["error"]["code"] == "scheduler_404", room.text
        assert "no model 'nothing' in the catalog" in room.json()["error"]["message"]
        bad = await http.get("/models/no such name")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_name", bad.text
        query = await http.get("/serve/plan", params={"source": SOURCE, "slots": 0})
        assert query.status_code == 400 and query.json()["error"]["code"] == "bad_query", query.text
        assert "slots" in query.json()["error"]["message"]
        plan = await http.get("/serve/plan", params={"source": SOURCE, "slots": 1})  # no agent: no node
        assert plan.status_code == 400 and plan.json()["error"]["code"] == "catalog_400", plan.text
        assert "start an agent" in plan.json()["error"]["message"]
        page = await http.get("/mirror", params={"limit": 1})
        assert page.status_code == 200 and len(page.json()["repos"]) == 1


def test_one_map_from_a_bus_error_to_what_every_face_answers():
    for code, status in (("400", 400), ("404", 404), ("409", 409), ("429", 429), ("500", 502), ("503", 502)):
        error = refused("catalog", code, "why")
        assert (error.status, error.code, error.message) == (status, f"catalog_{code}", "why")
        assert error.body()["error"]["type"] == ("server_error" if status == 502 else error.type)
