"""The admin API's mirror routes (/api/v1/mirror) on a real router, mirror and catalog over a real
nats-server, the Hub played by a local stand-in: admin keys only, a repo added (202) and followed to
ready, updated to a moved branch, listed, shown, removed (409 while a model uses it), and the
mirror's errors as the catalog's are (400, 404, 409) in OpenAI's error body."""

import asyncio

import httpx
import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import Model, ModelPut, ModelRef, catalog
from tests.fleets import SOURCE, serve_router


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("w") / "tiny.gguf")


class Admin:
    """The admin API of a router, with an admin key and a user's."""

    def __init__(self, router, hub, admin_key, user_key):
        self.hub, self.url = hub, router.http.url
        self.admin = {"authorization": f"Bearer {admin_key}"}
        self.user = {"authorization": f"Bearer {user_key}"}

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"{self.url}/api/v1", headers=self.admin, timeout=60)


@pytest.fixture
async def api(serve, nc, tmp_path, tiny, hub):
    served = await serve_router(serve, nc, tmp_path, tiny, hub)
    return Admin(served.router, hub, served.admin_key, served.user_key)


async def _until_ready(http: httpx.AsyncClient, repo: str, commit: str) -> dict:
    for _ in range(300):
        shown = (await http.get(f"/mirror/{repo}")).json()["repos"]
        found = next(r for r in shown if r["commit"] == commit)
        if found["state"] in ("ready", "failed"):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{repo}@{commit} never ended: {found}")


async def test_the_mirror_routes_answer_admin_keys_only(api):
    async with httpx.AsyncClient(base_url=f"{api.url}/api/v1", timeout=30) as http:
        assert (await http.get("/mirror")).status_code == 401
        refused = await http.get("/mirror", headers=api.user)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_admin"
        posted = await http.post("/mirror", json={"repo": "org/tiny"}, headers=api.user)
        assert posted.status_code == 403


async def test_a_repo_added_is_queued_202_followed_to_ready_and_updated_when_its_branch_moves(api, tiny):
    first = api.hub.add_repo("org/tiny", {"m.gguf": tiny, "model.pt": b"x" * 10})
    async with api.http() as http:
        added = await http.post("/mirror", json={"repo": "org/tiny", "by": "x"})
        assert added.status_code == 202, added.text
        body = added.json()
        assert (body["repo"], body["commit"], body["revision"], body["added_by"]) == ("org/tiny", first, "main", "ops")
        ready = await _until_ready(http, "org/tiny", first)
        assert ready["state"] == "ready" and [f["path"] for f in ready["files"]] == ["m.gguf"]
        assert [s["path"] for s in ready["skipped"]] == ["model.pt"]
        same = await http.post("/mirror/org/tiny/update")
        assert same.status_code == 202 and (same.json()["commit"], same.json()["state"]) == (first, "ready")
        second = api.hub.add_repo("org/tiny", {"m.gguf": tiny.read_bytes()[:-1] + b"\1"})
        moved = await http.post("/mirror/org/tiny/update")
        assert moved.status_code == 202 and moved.json()["commit"] == second
        assert (await _until_ready(http, "org/tiny", second))["state"] == "ready"
        listed = (await http.get("/mirror")).json()["repos"]
        assert sorted((r["repo"], r["commit"]) for r in listed) == sorted(
            [("demo/tiny", ""), ("org/tiny", first), ("org/tiny", second)]
        )


async def test_the_mirrors_errors_keep_their_meaning(api, tiny):
    api.hub.add_repo("org/tiny", {"m.gguf": tiny, "model.pt": b"x" * 10})
    async with api.http() as http:
        pickled = await http.post("/mirror", json={"repo": "org/tiny", "include": ["*.pt"]})
        assert pickled.status_code == 400 and pickled.json()["error"]["code"] == "mirror_400", pickled.text
        assert "model.pt is pickled weights" in pickled.json()["error"]["message"]
        missing = await http.post("/mirror", json={"repo": "org/nothing"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "mirror_404", missing.text
        assert "org/nothing" in missing.json()["error"]["message"]
        shown = await http.get("/mirror/org/nothing")
        assert shown.status_code == 404 and "the mirror holds no org/nothing" in shown.json()["error"]["message"]
        assert (await http.post("/mirror/org/nothing/update")).status_code == 404
        bad = await http.post("/mirror", json={"repo": "not-a-repo"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_body", bad.text
        commit = await http.delete("/mirror/demo/tiny", params={"commit": "main"})
        assert commit.status_code == 400 and commit.json()["error"]["code"] == "bad_repo", commit.text
        assert "40" in commit.json()["error"]["message"]


async def test_a_repo_a_model_uses_is_not_removed_409_naming_the_model(api, nc):
    await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE)))
    async with api.http() as http:
        refused = await http.delete("/mirror/demo/tiny")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "mirror_409", refused.text
        assert "tiny (demo/tiny/tiny.gguf)" in refused.json()["error"]["message"]
        await call(nc, catalog.MODEL_REMOVE, ModelRef(name="tiny"))
        removed = await http.delete("/mirror/demo/tiny")
        assert removed.status_code == 200 and [r["repo"] for r in removed.json()["repos"]] == ["demo/tiny"]
        assert (await http.get("/mirror")).json() == {"repos": [], "next": ""}  # the whole list: no page after
