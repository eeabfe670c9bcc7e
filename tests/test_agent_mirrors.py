"""A node takes a weights file from the mirror at its own site, another when that one fails, and a
file no mirror verified (placed by hand) from whichever mirror holds it."""

import asyncio
import hashlib

import httpx
import pytest
from structlog.testing import capture_logs

from llmgw.agent.cache import WeightsCache
from llmgw.agent.mirrors import fetch_nearest
from llmgw.gguf import write_random_llama
from llmgw.mirror.imports import Import
from llmgw.mirror.service import Mirror, MirrorConfig

SOURCE = "test/tiny/m.gguf"


@pytest.fixture
async def two_mirrors(serve, tmp_path):
    """Mirrors at sites 'north' and 'south', each holding a verified copy of one file."""
    weights = write_random_llama(tmp_path / "given" / "m.gguf")
    given = Import(path=str(weights), source=SOURCE, sha256=hashlib.sha256(weights.read_bytes()).hexdigest())
    mirrors = {}
    for node, site in (("m1", "north"), ("m2", "south")):
        config = MirrorConfig(node=node, site=site, root=str(tmp_path / node), imports=[given])
        mirrors[site] = await serve(Mirror(config), config)
    for m in mirrors.values():
        for _ in range(400):  # the import verified (bounded)
            if m.fetches.file(SOURCE) is not None:
                break
            await asyncio.sleep(0.05)
    return mirrors


async def _fetch(nc, tmp_path, site, name):
    """Fetch SOURCE into a fresh cache as a node at `site`: the path, the URLs asked, the log lines."""
    asked = []

    async def record(request):
        asked.append(str(request.url))

    async with httpx.AsyncClient(event_hooks={"request": [record]}) as http:
        cache = WeightsCache(tmp_path / name, http)
        with capture_logs() as logs:
            path = await fetch_nearest(nc, cache, SOURCE, site, window_s=1.0)
    return path, asked, logs


async def test_a_node_fetches_from_the_mirror_at_its_site_and_from_another_when_that_one_fails(
    two_mirrors, nc, tmp_path
):
    data = (two_mirrors["north"].root / SOURCE).read_bytes()
    for site, m in two_mirrors.items():
        path, asked, logs = await _fetch(nc, tmp_path, site, f"cache-{site}")
        assert path.read_bytes() == data and logs == []
        assert asked == [f"{m.http.url}/files/{SOURCE}"]
    south_url = two_mirrors["south"].http.url
    await two_mirrors["south"].http.stop()  # the south site's mirror can no longer serve
    path, asked, logs = await _fetch(nc, tmp_path, "south", "cache-south-again")
    assert path.read_bytes() == data
    assert asked == [f"{south_url}/files/{SOURCE}", f"{two_mirrors['north'].http.url}/files/{SOURCE}"]
    [warning] = [e for e in logs if e["event"] == "fetch from a mirror failed; trying the next"]
    assert (warning["mirror"], warning["source"], warning["log_level"]) == ("m2", SOURCE, "warning")


async def test_a_file_no_mirror_verified_comes_from_the_mirror_that_holds_it(serve, nc, tmp_path):
    by_hand = write_random_llama(tmp_path / "mirror" / SOURCE)
    config = MirrorConfig(node="m1", root=str(tmp_path / "mirror"))
    await serve(Mirror(config), config)
    path, asked, _ = await _fetch(nc, tmp_path, "", "cache")
    assert path.read_bytes() == by_hand.read_bytes() and len(asked) == 1
