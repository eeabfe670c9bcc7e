"""The mirror says whether a file's GGUF header reads, and answers quickly when asked not to hash."""

import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import FileRef
from llmgw.proto import mirror as mirror_api


@pytest.fixture
async def root(serve, tmp_path):
    root = tmp_path / "mirror"
    (root / "o/r").mkdir(parents=True)
    write_random_llama(root / "o/r/good.gguf")
    (root / "o/r/text.gguf").write_bytes(b"<html>not found</html>" * 10)
    cut = (root / "o/r/good.gguf").read_bytes()
    (root / "o/r/cut.gguf").write_bytes(cut[: len(cut) // 2])
    (root / "o/r/notes.txt").write_bytes(b"plain text")
    config = MirrorConfig(root=str(root))
    await serve(Mirror(config), config)
    return root


async def test_stat_says_why_a_gguf_files_header_does_not_read_and_nothing_for_one_that_reads(root, nc):
    good = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/good.gguf"))
    assert good.header_error == "" and len(good.sha256) == 64
    text = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/text.gguf"))
    assert text.header_error.startswith("o/r/text.gguf: not a GGUF file (it starts with b'<htm'")
    cut = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/cut.gguf"))
    assert "o/r/cut.gguf: cut short" in cut.header_error and str(root) not in cut.header_error
    notes = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/notes.txt"))
    assert notes.header_error == ""  # not a .gguf: no header to read


async def test_a_stat_that_asks_no_digest_hashes_nothing_and_gives_one_only_where_known(root, nc):
    quick = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/good.gguf", digest=False))
    assert quick.sha256 == "" and quick.size > 0 and not list(root.rglob(".*.sha256"))
    hashed = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/good.gguf"))
    again = await call(nc, mirror_api.FILE_STAT, FileRef(source="o/r/good.gguf", digest=False))
    assert again.sha256 == hashed.sha256 != ""
