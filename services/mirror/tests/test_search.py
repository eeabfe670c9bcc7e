"""The mirror's Hub search on its own (`llmgw.mirror.search`), against the Hub stand-in
(`llmgw.hubstandin`, not the Hub) through the real `huggingface_hub` client's session: the files
it lists and leaves out, a split model by its first part, a search that runs out of time."""

from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.hubstandin import HubStandIn
from llmgw.mirror.hub import Hub
from llmgw.mirror.search import search
from llmgw.proto.hub import HubSearch, fetch_glob


def test_a_split_model_is_listed_by_its_first_part_with_every_parts_header(tmp_path):
    first = write_random_llama(tmp_path / "split" / "m.gguf", TinyLlama(split_tensors=8))
    parts = sorted(first.parent.glob("m-*-of-*.gguf"))
    assert len(parts) > 2 and first == parts[0]
    with HubStandIn() as hub:
        hub.add_repo("acme/split-GGUF", {p.name: p for p in parts} | {"mmproj-m.gguf": first})
        found = search(Hub(hub.url), HubSearch(text="split"))
    (model,) = found.models
    (f,) = model.files
    assert f.path == first.name and f.parts == len(parts) and f.facts is not None
    assert fetch_glob(f.path) == f"m-*-of-{len(parts):05d}.gguf" and fetch_glob("a.gguf") == "a.gguf"


def test_a_search_out_of_time_lists_the_files_unread_saying_so(tmp_path):
    model = write_random_llama(tmp_path / "m.gguf")
    with HubStandIn() as hub:
        hub.add_repo("acme/slow-GGUF", {"a.gguf": model, "b.gguf": model})
        found = search(Hub(hub.url), HubSearch(text="slow"), within_s=0)
    files = found.models[0].files
    assert [f.facts for f in files] == [None, None]
    assert all("the search's 0 s ran out" in f.error for f in files) and found.bytes_read == found.headers_read == 0
