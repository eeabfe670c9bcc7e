"""The catalog refuses a model whose file's header does not read (the mirror says why)."""

import pytest

from llmgw.bus import BadRequest
from llmgw.catalog.core import check_file
from llmgw.proto import FileInfo, Model


def test_a_file_whose_header_does_not_read_is_refused_with_the_mirrors_reason():
    model = Model(name="m", source="o/r/m.gguf")
    check_file(model, FileInfo(source="o/r/m.gguf", size=10, sha256="", url=""))
    broken = FileInfo(source="o/r/m.gguf", size=10, sha256="", url="", header_error="o/r/m.gguf: not a GGUF file")
    with pytest.raises(BadRequest, match="model 'm': its file o/r/m.gguf: not a GGUF file; put a GGUF model there"):
        check_file(model, broken)


def test_a_pinned_source_the_mirror_holds_unverified_is_refused_and_a_verified_one_taken():
    source = f"o/r@{'a' * 40}/m.gguf"
    model = Model(name="m", source=source)
    with pytest.raises(BadRequest, match=f"the mirror has not verified {source}"):
        check_file(model, FileInfo(source=source, size=10, sha256="", url=""))
    check_file(model, FileInfo(source=source, size=10, sha256="", url="", verified=True))
