"""A node's weights cache keeps no file that failed verification: removed with a log line, fetched again."""

import os

import httpx
import pytest
from structlog.testing import capture_logs

from llmgw.agent.cache import FetchError, WeightsCache
from llmgw.gguf import write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import FileInfo, FileRef

SOURCE = "test/tiny/m.gguf"


@pytest.fixture
async def held(serve, tmp_path):
    """A mirror holding one file, and what its stat says of it."""
    path = write_random_llama(tmp_path / "mirror" / SOURCE)
    mirror = await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    return path, await mirror.stat(FileRef(source=SOURCE))


async def test_a_cached_file_damaged_on_disk_is_removed_with_a_log_line_and_fetched_again(held, tmp_path):
    path, info = held
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        cached = await cache.fetch(info)
        with open(cached, "r+b") as f:  # the same size, other bytes: a disk that rotted, a hand that slipped
            f.seek(info.size // 2)
            f.write(b"\0" * 64)
        with capture_logs() as logs:
            again = await cache.fetch(info)
        assert again == cached and again.read_bytes() == path.read_bytes() and cache.fetches == 2
        [removed] = [e for e in logs if e["event"] == "cached file failed verification; removed"]
        assert removed["log_level"] == "warning" and removed["source"] == SOURCE and removed["path"] == str(cached)
        with capture_logs() as logs:
            assert await cache.fetch(info) == cached and cache.fetches == 2  # verified once: not hashed again
        assert logs == []


async def test_a_fetch_that_fails_verification_leaves_nothing_in_the_cache_and_says_so(held, tmp_path):
    _, info = held
    lying = FileInfo(source=info.source, size=info.size, sha256="0" * 64, url=info.url)
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        with capture_logs() as logs, pytest.raises(FetchError, match="not the mirror's"):
            await cache.fetch(lying)
    assert list((tmp_path / "cache").iterdir()) == [] and cache.entries() == {}
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["fetched file failed verification; removed"]


async def test_a_file_changed_on_disk_after_its_check_is_checked_again(held, tmp_path):
    _, info = held
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        cached = await cache.fetch(info)
        os.utime(cached, ns=(0, 0))  # touched, not changed: it passes again and is kept
        with capture_logs() as logs:
            assert await cache.fetch(info) == cached and cache.fetches == 1
        assert logs == []
