"""The Hub searched for what fits, across real services over a real nats-server: the mirror asks
the Hub stand-in (`llmgw.hubstandin`, speaking the Hub's API to the real `huggingface_hub`
client) with `HfApi.list_models`, reads each GGUF file's header by range requests (no download),
and the catalog gives each file the ways it would run on the registered nodes. Through the admin
API and `llmgw ctl mirror search` alike; a rate-limited Hub is said, with when to try again."""

import asyncio
import subprocess
import sys

import httpx
import pytest

from llmgw.bus import call
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.proto import catalog, scheduler
from llmgw.proto.errors import BusError
from llmgw.proto.hub import HubSearch
from tests.fleets import cpu_node, serve_router


@pytest.fixture
async def searched(serve, nc, tmp_path, hub):
    models = tmp_path / "models"
    small = write_random_llama(models / "small.Q8_0.gguf", TinyLlama(tensor_type="Q8_0"))
    big = write_random_llama(models / "big.F32.gguf", TinyLlama(embedding=256, layers=4, feed_forward=512))
    hub.add_repo("acme/tiny-chat-GGUF", {"tiny-chat.Q8_0.gguf": small, "tiny-chat.F32.gguf": big, "README.md": b"x"})
    hub.add_repo("acme/tiny-chat", {"model.safetensors": b"\0" * 64, "config.json": b"{}"})  # no GGUF: not found
    hub.add_repo("other/tiny-chat-mmproj-GGUF", {"mmproj-tiny.gguf": small, "notes.gguf": b"GGUF but cut"})
    hub.popularity("acme/tiny-chat-GGUF", downloads=900, likes=12)
    hub.popularity("other/tiny-chat-mmproj-GGUF", downloads=5)
    served = await serve_router(serve, nc, tmp_path, small, hub=hub, scheduler=True)
    await call(nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    return served


async def test_a_search_lists_gguf_models_with_their_headers_and_the_ways_each_runs_here(searched, nc, hub):
    before = hub.bytes_served
    ways = await call(nc, catalog.HUB_SEARCH, HubSearch(text="tiny chat"))
    found = ways.found
    assert [m.repo for m in found.models] == ["acme/tiny-chat-GGUF", "other/tiny-chat-mmproj-GGUF"]  # by downloads
    first = found.models[0]
    assert (first.downloads, first.likes, len(first.commit)) == (900, 12, 40)
    assert [f.path for f in first.files] == ["tiny-chat.F32.gguf", "tiny-chat.Q8_0.gguf"]
    for f in first.files:
        assert f.facts is not None and f.error == "" and f.size > 0
        assert f.source == f"acme/tiny-chat-GGUF@{first.commit}/{f.path}"
        plan = ways.plans[f.source]
        assert [w.kind for w in plan.ways] == ["cpu"] and plan.ways[0].nodes_fit == ["a"]
        assert plan.ways[0].tokens_per_s > 0
    assert {f.facts.quant for f in first.files} == {"F32", "Q8_0"}
    cut = found.models[1].files  # the projector is left out; a file that is not GGUF says so
    assert [f.path for f in cut] == ["notes.gguf"] and "did not read" in cut[0].error and cut[0].facts is None
    assert ways.nodes == 1 and found.headers_read == 3
    served = hub.bytes_served - before
    assert found.bytes_read == served < sum(f.size for f in first.files) + 2 * 65536  # headers, never whole files


async def test_a_file_past_the_search_s_reading_is_listed_unread(searched, nc):
    ways = await call(nc, catalog.HUB_SEARCH, HubSearch(text="tiny-chat-GGUF", files=1))
    (model,) = [m for m in ways.found.models if m.repo == "acme/tiny-chat-GGUF"]
    assert [f.facts is not None for f in model.files] == [True, False]
    assert "a search reads 1 files' headers at most" in model.files[1].error


async def test_a_rate_limited_hub_is_waited_for_briefly_else_said_with_when_to_try_again(searched, nc, hub):
    hub.rate_limit(1, retry_after_s=1)
    ways = await call(nc, catalog.HUB_SEARCH, HubSearch(text="tiny"))  # waited a second, asked again
    assert ways.found.models
    hub.rate_limit(2, retry_after_s=120)
    with pytest.raises(BusError) as limited:
        await call(nc, catalog.HUB_SEARCH, HubSearch(text="tiny"))
    assert limited.value.code == "429" and "rate-limits searches now: try again in 120 s" in limited.value.message
    hub.clear_faults()


async def test_the_admin_api_and_ctl_search_alike(searched, nats_server):
    async with httpx.AsyncClient(
        base_url=f"{searched.router.http.url}/api/v1", headers={"authorization": f"Bearer {searched.admin_key}"}
    ) as http:
        got = await http.get("/hub/search", params={"text": "tiny chat", "limit": 1})
        assert got.status_code == 200, got.text
        assert [m["repo"] for m in got.json()["found"]["models"]] == ["acme/tiny-chat-GGUF"]
        empty = await http.get("/hub/search", params={"text": ""})
        assert empty.status_code == 400 and "text" in empty.json()["error"]["message"]
        nothing = await http.get("/hub/search", params={"text": "no such model anywhere"})
        assert nothing.status_code == 200 and nothing.json()["found"]["models"] == []
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    done = await asyncio.to_thread(
        subprocess.run, [*ctl, "mirror", "search", "tiny", "chat"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "acme/tiny-chat-GGUF  (900 downloads, 12 likes)" in out
    assert "tiny-chat.Q8_0.gguf" in out and "CPU, ~" in out and "fits now on a" in out
    assert "no file downloaded" in out and "llmgw ctl mirror add acme/tiny-chat-GGUF@" in out
    assert "llmgw ctl model serve acme/tiny-chat-GGUF@" in out
