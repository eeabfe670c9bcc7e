"""A member and an operator through every face with their own credentials, on a real nats-server
with the real mirror, catalog and router: the admin API and `llmgw ctl --api` with a key their
user owns. Each sees its own (a member: its keys, usage and requests; an operator: also its
tenants' keys and the models they may use, and their audit trail); another tenant's reads as
what is not there, and no refusal names anything of it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import msgspec
import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import KeyCreate, Model, ModelPut, UsageRecord, catalog, people
from llmgw.proto import router as router_api
from llmgw.proto.people import Tenant, UserCreate, UserRole
from tests.fleets import SOURCE, serve_router


class World(msgspec.Struct):
    api: str
    keys: dict[str, str]
    """Whose -> the key itself."""
    ids: dict[str, str]
    """Whose -> its key id."""


@pytest.fixture
async def world(serve, nc, tmp_path):
    served = await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"))
    for name in ("one", "two"):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name=name, source=SOURCE), by="t"))
    await call(nc, people.TENANT_PUT, Tenant(name="lab", models=["one"], by="t"))
    await call(nc, people.TENANT_PUT, Tenant(name="shop", models=["two"], by="t"))
    for name, tenant, role in (("mia", "lab", "member"), ("otto", "lab", "operator"), ("sam", "shop", "member")):
        await call(nc, people.USER_CREATE, UserCreate(name=name, tenant=tenant, role=role, by="t"))
    accounts, keys, ids = served.router.accounts, {}, {}
    for whose, tenant, owner in (
        ("mia", "lab", "mia"),
        ("otto", "lab", "otto"),
        ("sam", "shop", "sam"),
        ("svc", "lab", ""),
    ):
        made = await accounts.create_key(KeyCreate(name=f"{whose}-key", tenant=tenant, owner=owner))
        keys[whose], ids[whose] = made.key, made.id
    now = time.time()
    records = [
        UsageRecord(request_id=f"r-{w}", time=now - 5, key=ids[w], project="default", tenant=t, model=m)
        for w, t, m in (("mia", "lab", "one"), ("sam", "shop", "two"), ("otto", "lab", "one"))
    ]
    js = nc.jetstream()
    for record in records:
        await js.publish(router_api.USAGE.subject(record.project, record.model), msgspec.json.encode([record]))
    for _ in range(200):  # the router's copies of the keys, the catalog and the usage follow watches
        summed = await accounts.sum_usage(router_api.UsageQuery(since=now - 60, group_by="key"))
        if {"one", "two"} <= set(served.router.directory.names()) and len(summed.rows) == 3:
            break
        await asyncio.sleep(0.05)
    return World(api=f"{served.router.http.url}/api/v1", keys=keys, ids=ids)


def _as(world: World, whose: str) -> dict[str, str]:
    return {"authorization": f"Bearer {world.keys[whose]}"}


def _secret_free(world: World, text: str, *others: str) -> None:
    """Nothing of another tenant in `text`: its user, its key's id, its model."""
    for word in (*others, world.ids["sam"], world.keys["sam"]):
        assert word not in text, (word, text[:300])


async def test_a_member_sees_and_changes_only_its_own_on_the_admin_api(world):
    async with httpx.AsyncClient(timeout=30) as http:
        mia = _as(world, "mia")
        keys = (await http.get(f"{world.api}/keys", headers=mia)).json()["keys"]
        assert set(keys) == {world.ids["mia"]}
        for other in (world.ids["sam"], "0123456789abcdef"):  # another tenant's key reads as none at all
            gone = await http.delete(f"{world.api}/keys/{other}", headers=mia)
            assert gone.status_code == 404 and gone.json()["error"]["message"] == (
                f"No key of yours has id '{other}'; GET /api/v1/keys lists them."
            )
        since = {"since": time.time() - 60}
        usage = await http.get(f"{world.api}/usage", headers=mia, params={**since, "group_by": "key"})
        assert [r["group"] for r in usage.json()["rows"]] == [world.ids["mia"]], usage.text
        for asked, seen in (({}, ["r-mia"]), ({"keys": world.ids["sam"]}, [])):  # another's key: nothing at all
            log = await http.get(f"{world.api}/requests", headers=mia, params=asked)
            assert [r["request_id"] for r in log.json()["requests"]] == seen, log.text
        by_model = await http.get(f"{world.api}/usage", headers=mia, params={**since, "group_by": "model"})
        assert by_model.status_code == 403 and "by key (yours only)" in by_model.json()["error"]["message"]
        made = await http.post(f"{world.api}/keys", headers=mia, json={"name": "mine", "tenant": "lab"})
        assert made.status_code == 201 and made.json()["key"].startswith("sk-"), made.text
        listed = (await http.get(f"{world.api}/keys", headers=mia)).json()["keys"]
        assert sorted(k["name"] for k in listed.values()) == ["mia-key", "mine"]
        assert {(k["tenant"], k["owner"]) for k in listed.values()} == {("lab", "mia")}
        for body, says in (
            ({"name": "x", "tenant": "shop"}, "You have no role in tenant 'shop'; make keys in lab."),
            ({"name": "x", "tenant": "lab", "admin": True}, "Only an admin makes admin keys."),
            ({"name": "x", "tenant": "lab", "owner": "otto"}, "You make keys of your own"),
            ({"name": "x", "tenant": "lab", "project": "shop"}, "belong to its project 'lab'"),
        ):
            refused = await http.post(f"{world.api}/keys", headers=mia, json=body)
            assert refused.status_code == 403 and says in refused.json()["error"]["message"], refused.text
        for path in ("/users", "/tenants", "/audit", "/models", "/fleet/nodes", "/mirror", "/signin"):
            refused = await http.get(f"{world.api}{path}", headers=mia)
            assert refused.status_code == 403, (path, refused.text)
            _secret_free(world, refused.text, "sam", "shop", "two")
        service = await http.get(f"{world.api}/keys", headers=_as(world, "svc"))
        assert service.status_code == 403 and "asks models only" in service.json()["error"]["message"]


async def test_an_operator_runs_its_tenants_models_and_reads_their_keys_and_audit(world, nc):
    async with httpx.AsyncClient(timeout=30) as http:
        otto = _as(world, "otto")
        models = (await http.get(f"{world.api}/models", headers=otto)).json()["models"]
        assert [m["model"]["name"] for m in models] == ["one"]
        for name in ("two", "nothing"):  # another tenant's model and none at all read the same
            for answer in (
                await http.get(f"{world.api}/models/{name}", headers=otto),
                await http.post(f"{world.api}/models/{name}/change", headers=otto, json={"action": "stop"}),
                await http.delete(f"{world.api}/models/{name}", headers=otto),
            ):
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["message"].startswith(f"No model '{name}' among those your tenants")
        stopped = await http.post(f"{world.api}/models/one/change", headers=otto, json={"action": "stop"})
        assert stopped.status_code == 200 and stopped.json()["changed_by"] == "otto", stopped.text
        keys = (await http.get(f"{world.api}/keys", headers=otto)).json()["keys"]
        assert set(keys) == {world.ids[w] for w in ("mia", "otto", "svc")}
        usage = await http.get(f"{world.api}/usage", headers=otto, params={"since": 0, "group_by": "tenant"})
        assert [r["group"] for r in usage.json()["rows"]] == ["lab"]
        trail = (await http.get(f"{world.api}/audit", headers=otto)).json()["entries"]
        assert trail and all(e["tenant"] == "lab" or e["area"] in ("catalog", "mirror") for e in trail)
        _secret_free(world, str(trail), "sam")
        for path in ("/users", "/tenants", "/signin"):
            assert (await http.get(f"{world.api}{path}", headers=otto)).status_code == 403
        as_admin = await http.post(f"{world.api}/keys", headers=otto, json={"name": "x", "tenant": "lab", "owner": "t"})
        assert as_admin.status_code == 403  # no key of another user's, which would act as that user
        # a role changed counts from the next request: mia made an operator of lab
        await call(nc, people.USER_ROLE, UserRole(name="mia", tenant="lab", role="operator", by="t"))
        for _ in range(100):
            seen = await http.get(f"{world.api}/models", headers=_as(world, "mia"))
            if seen.status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert [m["model"]["name"] for m in seen.json()["models"]] == ["one"]


def _ctl(world: World, whose: str, *words: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMGW_API_KEY": world.keys[whose]}
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--api", world.api.removesuffix("/api/v1"), *words]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


async def test_ctl_with_a_users_own_key_asks_through_the_admin_api_under_the_same_rule(world):
    keys = await asyncio.to_thread(_ctl, world, "mia", "key", "list")
    assert keys.returncode == 0 and world.ids["mia"] in keys.stdout, keys.stderr
    _secret_free(world, keys.stdout + keys.stderr, "sam-key")
    revoke = await asyncio.to_thread(_ctl, world, "mia", "key", "revoke", world.ids["sam"])
    assert revoke.returncode == 1 and f"No key of yours has id '{world.ids['sam']}'" in revoke.stderr
    users = await asyncio.to_thread(_ctl, world, "mia", "user", "list")
    assert users.returncode == 1 and "This needs the admin role; your key's user has member." in users.stderr
    usage = await asyncio.to_thread(_ctl, world, "mia", "usage", "--by", "key", "--json")
    assert usage.returncode == 0 and [r["group"] for r in msgspec.json.decode(usage.stdout)["rows"]] == [
        world.ids["mia"]
    ]
    models = await asyncio.to_thread(_ctl, world, "otto", "model", "list")
    assert models.returncode == 0 and "one" in models.stdout and "two" not in models.stdout, models.stderr
    stopped = await asyncio.to_thread(_ctl, world, "otto", "model", "stop", "one")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    refused = await asyncio.to_thread(_ctl, world, "otto", "model", "stop", "two")
    assert refused.returncode == 1 and "No model 'two' among those your tenants may use" in refused.stderr
    made = await asyncio.to_thread(_ctl, world, "mia", "key", "create", "laptop", "--tenant", "lab")
    assert made.returncode == 0 and made.stdout.strip().startswith("sk-"), made.stderr
    nokey = subprocess.run(
        [sys.executable, "-m", "llmgw.ctl", "ctl", "--api", "http://127.0.0.1:1", "key", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "LLMGW_API_KEY"},
    )
    assert nokey.returncode == 2 and "put it in $LLMGW_API_KEY" in nokey.stderr
