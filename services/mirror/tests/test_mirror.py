"""The mirror: sources that cannot climb out, Range requests, stat over NATS and HTTP."""

import hashlib

import httpx
import pytest

from llmgw.bus import NotFound, call
from llmgw.mirror.core import RangeNotSatisfiable, parse_range, source_path
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, FileRef
from llmgw.proto import mirror as mirror_api


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, None),
        ("bytes=0-3", 10, (0, 3)),
        ("bytes=5-", 10, (5, 9)),
        ("bytes=-4", 10, (6, 9)),
        ("bytes=8-100", 10, (8, 9)),
        ("bytes=-100", 10, (0, 9)),
    ],
)
def test_a_range_names_the_bytes_it_asks_for(header, size, expected):
    assert parse_range(header, size) == expected


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=5-2", "items=0-1", "bytes=0-1,3-4", "bytes=a-b", "bytes=-0"])
def test_a_range_outside_the_file_or_malformed_is_refused(header):
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 10)


@pytest.mark.parametrize("source", ["../x/y", "o/../../etc", "/etc/passwd/x", "o/r", "o//f"])
def test_a_source_cannot_leave_the_mirror(source):
    with pytest.raises(ValueError):
        source_path(source)


@pytest.fixture
async def mirror(serve, nc, tmp_path):
    root = tmp_path / "mirror"
    (root / "org/repo").mkdir(parents=True)
    (root / "org/repo/w.gguf").write_bytes(bytes(range(256)) * 4)
    config = MirrorConfig(root=str(root))
    return await serve(Mirror(config), config)


async def test_stat_gives_size_sha256_and_a_url_that_serves_ranges(mirror, nc):
    data = bytes(range(256)) * 4
    info = await call(nc, mirror_api.FILE_STAT, FileRef(source="org/repo/w.gguf"))
    assert (info.size, info.sha256) == (1024, hashlib.sha256(data).hexdigest())
    async with httpx.AsyncClient() as client:
        whole = await client.get(info.url)
        part = await client.get(info.url, headers={"range": "bytes=10-19"})
        bad = await client.get(info.url, headers={"range": "bytes=5000-"})
        missing = await client.get(info.url.replace("w.gguf", "nope.gguf"))
    assert whole.status_code == 200 and whole.content == data
    assert part.status_code == 206 and part.content == data[10:20]
    assert part.headers["content-range"] == "bytes 10-19/1024"
    assert bad.status_code == 416 and bad.headers["content-range"] == "bytes */1024"
    assert missing.status_code == 404
    listed = await call(nc, mirror_api.FILE_LIST, Empty())
    assert [f.source for f in listed.files] == ["org/repo/w.gguf"]


async def test_a_file_it_does_not_hold_is_a_404_saying_where_it_looked(mirror, nc):
    with pytest.raises(NotFound, match="holds no file 'org/repo/other.gguf'"):
        await call(nc, mirror_api.FILE_STAT, FileRef(source="org/repo/other.gguf"))
