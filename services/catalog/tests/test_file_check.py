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
