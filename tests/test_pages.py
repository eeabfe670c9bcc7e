"""Lists too big for one NATS message (1 MB), on a real nats-server with each service's own
identity: they come in pages, `llmgw ctl` and every other caller follow them, and a caller from
before pages that asks for the whole list is told to ask in pages (it once got a 6.6 MB reply it
could not take: `MaxPayloadError`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import msgspec
import pytest

from llmgw.bus import call, request_raw
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.proto import BUCKETS, CatalogRecord, KeyRecord, Model, Page
from llmgw.proto import catalog as catalog_api
from llmgw.proto import router as router_api
from llmgw.router.service import Router, RouterConfig

MANY = [20_000, pytest.param(100_000, marks=pytest.mark.long)]
"""Rows in a list: 20,000 already take pages (a few MB); 100,000 is the long suite's (`just long`)."""


async def _put_all(nc, bucket: str, entries: dict[str, bytes]) -> None:
    """Write every entry into a bucket as its owner would, without waiting on each."""
    js, pending = nc.jetstream(), []
    for key, value in entries.items():
        pending.append(await js.publish_async(f"$KV.{bucket}.{key}", value))
        if len(pending) >= 5000:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


async def _until(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.2)


def _refused_whole(reply) -> str:
    """The error of a reply to `{}` (the whole list at once, as callers from before pages ask)."""
    headers = reply.headers or {}
    assert headers.get("Nats-Service-Error-Code") == "400", (headers, reply.data[:200])
    return headers["Nats-Service-Error"]


@pytest.mark.parametrize("many", MANY)
async def test_llmgw_ctl_lists_many_keys_page_by_page(serve, nc, nats_server, many):
    router = await serve(Router(RouterConfig(http_port=0)), RouterConfig(http_port=0))
    now = time.time()
    records = {
        f"{i:016x}{'0' * 48}": KeyRecord(name=f"key-{i}", created=now - many + i, project=f"p{i % 50}", models=["m"])
        for i in range(many)
    }
    await _put_all(nc, BUCKETS["keys"], {h: msgspec.json.encode(r) for h, r in records.items()})
    await _until(lambda: len(router.accounts.keys.items) == many)

    whole = await request_raw(nc, router_api.KEY_LIST.subject(), b"{}", timeout=60)
    assert "ask for them in pages" in _refused_whole(whole)

    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    done = await asyncio.to_thread(
        subprocess.run, [*ctl, "key", "list", "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    listed = json.loads(done.stdout)["keys"]
    assert list(listed) == [h[:16] for h in records]  # every key once, oldest first
    assert listed[f"{many - 1:016x}"]["name"] == f"key-{many - 1}"


@pytest.mark.parametrize("many", MANY)
async def test_many_models_come_in_pages_each_read_once(serve, nc, many):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    names = [f"model-{i:06d}" for i in range(many)]
    records = {n: msgspec.json.encode(CatalogRecord(model=Model(name=n, source="o/r/m.gguf"))) for n in names}
    await _put_all(nc, BUCKETS["catalog"], records)

    whole = await request_raw(nc, catalog_api.MODEL_LIST.subject(), b"{}", timeout=120)
    assert "ask for them in pages" in _refused_whole(whole)
    first = await call(nc, catalog_api.MODEL_LIST, Page(limit=10))
    assert [e.model.name for e in first.models] == names[:10] and first.next
    listed = await call(nc, catalog_api.MODEL_LIST, Page(), timeout=120)  # every page, joined
    assert [e.model.name for e in listed.models] == names and not listed.next
