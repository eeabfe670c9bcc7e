"""`llmgw ctl model plan OWNER/REPO` plans the GGUF files the mirror holds of a repo: a repo added
with `mirror add` is held at its commit ('OWNER/REPO@COMMIT/FILE'), which it once did not see
("the mirror holds no GGUF file", unless the commit was named)."""

from llmgw.ctl.fleet_commands import gguf_files
from llmgw.proto import FileInfo

C = "c" * 40


def _held(*sources: str) -> list[FileInfo]:
    return [FileInfo(source=s, size=1, sha256="", url=f"http://m/files/{s}") for s in sources]


def test_a_repo_is_planned_at_every_commit_held_and_by_hand():
    files = _held(
        f"org/model@{C}/m-q4.gguf",
        f"org/model@{C}/README.md",
        f"org/model@{C}/big-00001-of-00002.gguf",
        f"org/model@{C}/big-00002-of-00002.gguf",
        "org/model/placed.gguf",
        "org/model-other/x.gguf",
    )
    assert [f.source for f in gguf_files(files, "org/model")] == [
        f"org/model@{C}/m-q4.gguf",
        f"org/model@{C}/big-00001-of-00002.gguf",
        "org/model/placed.gguf",
    ]
    assert [f.source for f in gguf_files(files, f"org/model@{C}")] == [
        f"org/model@{C}/m-q4.gguf",
        f"org/model@{C}/big-00001-of-00002.gguf",
    ]
    assert gguf_files(files, "org/nothing") == []
