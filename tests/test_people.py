"""People and tenants on a real nats-server with the real mirror, catalog and router: users made
and removed through `llmgw ctl` (a local user's password hashed, shown once), a tenant's models
held on the OpenAI endpoint, signing in slowed after wrong passwords, a user's keys ending with
it, keys from before tenants landing in the default one, and every change on the audit trail
(`llmgw ctl audit`) without a secret."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import msgspec
import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import BUCKETS, KeyCreate, Model, ModelPut, catalog
from llmgw.router.accounts.keys import key_hash
from llmgw.router.accounts.people import LOCK_AFTER, Locked, SignInRefused
from tests.fleets import SOURCE, serve_router


@pytest.fixture
async def served(serve, nc, tmp_path):
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    got = await serve_router(serve, nc, tmp_path, tiny)
    for name in ("one", "two"):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name=name, source=SOURCE), by="t"))
    for _ in range(100):  # the router's copy of the catalog follows a KV watch
        if {"one", "two"} <= set(got.router.directory.names()):
            break
        await asyncio.sleep(0.05)
    return got


def _ctl(nats_server, *words: str, stdin: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], input=stdin, capture_output=True, text=True, timeout=60)


async def test_users_and_tenants_through_ctl_a_tenants_models_held_and_the_audit_trail(served, nats_server, nc):
    ctl = lambda *w, stdin="": asyncio.to_thread(_ctl, nats_server, *w, stdin=stdin)  # noqa: E731
    missing = await ctl("user", "create", "ada", "--tenant", "research", "--role", "operator")
    assert (
        missing.returncode == 1 and "there is no tenant 'research': `llmgw ctl tenant put research`" in missing.stderr
    )
    assert (await ctl("tenant", "put", "research", "--models", "one")).returncode == 0
    made = await ctl("user", "create", "ada", "--tenant", "research", "--role", "operator")
    assert made.returncode == 0, made.stderr
    password = made.stdout.strip()
    assert len(password) >= 12 and "shown this once" in made.stderr
    short = await ctl("user", "create", "bob", "--password-stdin", stdin="short\n")
    assert short.returncode == 1 and "at least 12 characters" in short.stderr
    again = await ctl("user", "create", "ada")
    assert again.returncode == 1 and "already a user 'ada'" in again.stderr
    listed = (await ctl("user", "list")).stdout
    assert "operator of research" in listed and "$argon2" not in listed

    people = served.router.accounts.people
    assert (await people.sign_in("ada", password, 0.0)).roles == {"research": "operator"}
    for _ in range(LOCK_AFTER):
        with pytest.raises(SignInRefused, match="that name and password do not sign in"):
            await people.sign_in("ada", "wrong-password!", 1.0)
    with pytest.raises(Locked, match="too many wrong passwords for 'ada' in a row: signing in as it waits 30 s"):
        await people.sign_in("ada", password, 1.0)
    with pytest.raises(SignInRefused):  # no such user: the same words
        await people.sign_in("nobody", "whatever-it-is", 0.0)

    key = await served.router.accounts.create_key(KeyCreate(name="ada-key", tenant="research", owner="ada"))
    base = f"{served.router.http.url}/v1"
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {key.key}"}, timeout=30) as http:
        assert [m["id"] for m in (await http.get(f"{base}/models")).json()["data"]] == ["one"]
        refused = await http.post(
            f"{base}/chat/completions", json={"model": "two", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert refused.status_code == 403
        assert "The tenant 'research' may not use model 'two'; it may use one." in refused.json()["error"]["message"]
    removed = await ctl("user", "remove", "ada")
    assert removed.returncode == 0 and "its sessions and keys end at once" in removed.stderr
    assert key_hash(key.key) not in served.router.accounts.keys.items and people.user("ada") is None

    await call(
        nc, catalog.MODEL_PUT, ModelPut(model=Model(name="one", source=SOURCE, context=2048), revision=None, by="ops")
    )
    made_key = await ctl("key", "create", "ci", "--json")
    key_id = msgspec.json.decode(made_key.stdout)["id"]
    assert (await ctl("key", "revoke", key_id)).returncode == 0
    trail = await ctl("audit", "--json")
    entries = msgspec.json.decode(trail.stdout)["entries"]
    seen = [(e["area"], e["action"], e["subject"], e["who"]) for e in entries]
    assert ("users", "create", "ada", "ctl") in seen and ("users", "remove", "ada", "ctl") in seen
    assert ("tenants", "put", "research", "ctl") in seen and ("catalog", "put", "one", "ops") in seen
    assert ("keys", "create", f"ci ({key_id})", "ctl") in seen and ("keys", "revoke", f"ci ({key_id})", "ctl") in seen
    change = next(e for e in entries if e["area"] == "catalog" and e["who"] == "ops")
    assert '"context":2048' in change["after"] and '"context":2048' not in change["before"]
    assert "$argon2" not in trail.stdout and password not in trail.stdout
    table = (await ctl("audit", "--area", "users")).stdout.splitlines()
    assert table[0].split()[:4] == ["TIME", "(UTC)", "WHO", "AREA"] and all("users" in row for row in table[1:])


async def test_a_key_from_before_tenants_lands_in_the_default_tenant_and_works(served, nc):
    """A key written by a router from before tenants (no tenant, no owner in its record)."""
    old = {"name": "old", "created": 1.0, "project": "default", "models": [], "limits": {}}
    kv = await nc.jetstream().key_value(BUCKETS["keys"])
    await kv.put(key_hash("sk-llmgw-from-before"), msgspec.json.encode(old))
    for _ in range(100):
        if key_hash("sk-llmgw-from-before") in served.router.accounts.keys.items:
            break
        await asyncio.sleep(0.05)
    record = served.router.accounts.keys.items[key_hash("sk-llmgw-from-before")]
    assert (record.tenant, record.owner) == ("default", "")
    async with httpx.AsyncClient(timeout=30) as http:  # the router runs on this loop
        listed = await http.get(
            f"{served.router.http.url}/v1/models", headers={"authorization": "Bearer sk-llmgw-from-before"}
        )
    assert listed.status_code == 200 and {"one", "two"} <= {m["id"] for m in listed.json()["data"]}


async def test_the_admin_api_serves_users_tenants_and_the_audit_trail_for_admin_keys_only(served):
    api = f"{served.router.http.url}/api/v1"
    async with httpx.AsyncClient(timeout=30) as http:
        admin = {"authorization": f"Bearer {served.admin_key}"}
        made = await http.post(f"{api}/users", headers=admin, json={"name": "cat", "role": "member"})
        assert made.status_code == 201 and len(made.json()["password"]) >= 12, made.text
        listed = await http.get(f"{api}/users", headers=admin)
        assert [u["name"] for u in listed.json()["users"]] == ["cat"] and listed.json()["users"][0]["password"] == ""
        put = await http.put(f"{api}/tenants/lab", headers=admin, json={"models": ["one"]})
        assert put.status_code == 200, put.text
        trail = (await http.get(f"{api}/audit", headers=admin, params={"area": "users"})).json()["entries"]
        assert [(e["action"], e["subject"], e["who"]) for e in trail] == [("create", "cat", "ops")]
        nowhere = await http.post(f"{api}/keys", headers=admin, json={"name": "k", "tenant": "nowhere"})
        assert nowhere.status_code == 400 and "there is no tenant 'nowhere'" in nowhere.json()["error"]["message"]
        user = {"authorization": f"Bearer {served.user_key}"}
        for path in ("/users", "/tenants", "/audit"):
            refused = await http.get(f"{api}{path}", headers=user)
            assert refused.status_code == 403 and "cat" not in refused.text


async def test_a_tenants_limits_hold_for_all_its_keys_together(served, nats_server):
    put = await asyncio.to_thread(_ctl, nats_server, "tenant", "put", "lab", "--rpm", "2")
    assert put.returncode == 0 and "its keys together: requests_per_minute=2" in put.stderr, put.stderr
    listed = (await asyncio.to_thread(_ctl, nats_server, "tenant", "list")).stdout
    assert "lab" in listed and "requests_per_minute=2" in listed
    accounts = served.router.accounts
    keys = [await accounts.create_key(KeyCreate(name=f"lab-{i}", tenant="lab", project=f"p{i}")) for i in range(2)]
    ask = {"model": "one", "messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    async with httpx.AsyncClient(timeout=30) as http:
        for key in (keys[0], keys[1], keys[0]):
            url, auth = f"{served.router.http.url}/v1/chat/completions", {"authorization": f"Bearer {key.key}"}
            answer = await http.post(url, json=ask, headers=auth)
            statuses.append((answer.status_code, answer.json()["error"]["message"]))
    assert [s for s, _ in statuses[:2]] != [429, 429]  # each key alone is far from any limit of its own
    assert statuses[2][0] == 429 and "tenant 'lab'" in statuses[2][1], statuses
