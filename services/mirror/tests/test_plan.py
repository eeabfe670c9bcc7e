"""What the mirror fetches of a repo, and what a file's first bytes say (pure rules)."""

import json
import pickle

import pytest

from llmgw.mirror.checks import pickle_inside, safetensors_error
from llmgw.mirror.plan import Published, Rate, Refused, check_room, choose, safe_path

COMMIT = "c" * 40


def files(*paths):
    return [
        Published(path=p, size=10, sha256="s" if p.endswith((".gguf", ".safetensors", ".bin")) else "") for p in paths
    ]


def test_by_default_every_gguf_is_fetched_and_nothing_else_beside_gguf():
    chosen, skipped = choose("o/r", COMMIT, files("a-Q4.gguf", "a-Q8.gguf", "README.md", "config.json"), [])
    assert [f.path for f in chosen] == ["a-Q4.gguf", "a-Q8.gguf"] and skipped == []


def test_safetensors_bring_their_configs_and_tokenizers_and_pickles_beside_them_are_skipped():
    repo = files("model.safetensors", "config.json", "tokenizer.json", "tokenizer.model", "pytorch_model.bin", "x.py")
    chosen, skipped = choose("o/r", COMMIT, repo, [])
    assert [f.path for f in chosen] == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer.model"]
    assert [s.path for s in skipped] == ["pytorch_model.bin"]


def test_include_narrows_to_one_quantisation_by_path_or_file_name():
    chosen, _ = choose("o/r", COMMIT, files("q/a-Q4_K_M.gguf", "q/a-Q8_0.gguf"), ["*Q4_K_M.gguf"])
    assert [f.path for f in chosen] == ["q/a-Q4_K_M.gguf"]


@pytest.mark.parametrize(
    ("paths", "include", "match"),
    [
        (("pytorch_model.bin", "config.json"), [], r"pickled weights.*runs whatever code.*GGUF"),
        (("model.pt",), [], "pickled"),
        (("model.safetensors", "model.bin"), ["*.bin"], r"same weights as model.safetensors: include those"),
        (("a.gguf",), ["*.onnx"], r"no file matches \*\.onnx; it has a.gguf"),
        (("notes.txt",), [], "no GGUF or safetensors file"),
        (("../evil.gguf", "a.gguf"), ["*evil*"], "climbs out of the repo"),
    ],
)
def test_a_choice_that_would_fetch_pickles_or_nothing_is_refused_saying_why(paths, include, match):
    with pytest.raises(Refused, match=match):
        choose("o/r", COMMIT, files(*paths), include)


def test_a_name_that_climbs_out_of_the_repo_is_never_chosen():
    chosen, skipped = choose("o/r", COMMIT, files("../evil.gguf", "/etc/x.gguf", "a.gguf"), [])
    assert [f.path for f in chosen] == ["a.gguf"] and len(skipped) == 2


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/abs", "a\\b", "a//b", "a/.hidden", "sp ace.gguf"])
def test_unsafe_paths_are_named_as_such(path):
    assert safe_path(path)


def test_the_room_check_counts_what_must_stay_free():
    check_room("/m", needed=10, free=100, keep_free=90)
    with pytest.raises(Refused, match="has 100 B free; fetching needs 11 B and keeps 90 B free"):
        check_room("/m", needed=11, free=100, keep_free=90)


def test_the_rate_is_over_the_window_and_the_time_left_follows():
    rate = Rate(window_s=5)
    assert rate.per_s() == 0 and rate.eta_s(100) is None
    for t in range(11):
        rate.add(float(t), t * 1000)
    assert rate.per_s() == pytest.approx(1000) and rate.eta_s(5000) == pytest.approx(5)


def test_a_pickle_or_a_torch_zip_is_seen_in_its_first_bytes():
    assert "protocol 4" in pickle_inside(pickle.dumps({"w": 1}, protocol=4))
    assert "zip" in pickle_inside(b"PK\x03\x04....archive/data.pkl....")
    assert pickle_inside(b"GGUF\x03\x00\x00\x00") == ""


def _tensors(table, data=8):
    header = json.dumps(table).encode()
    return len(header).to_bytes(8, "little"), header, 8 + len(header) + data


def test_a_safetensors_header_reads_when_every_tensor_lies_inside_the_file():
    first8, header, size = _tensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {}})
    assert safetensors_error(first8, header, size) == ""


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, "does not lie inside"),
        ({"w": {"shape": [2], "data_offsets": [0, 8]}}, "does not lie inside"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_a_safetensors_header_that_does_not_hold_together_says_what(table, match):
    assert match in safetensors_error(*_tensors(table))


def test_a_file_that_announces_a_header_longer_than_itself_is_not_safetensors():
    assert "announce" in safetensors_error((10**6).to_bytes(8, "little"), b"", 100)
    assert "not JSON" in safetensors_error((4).to_bytes(8, "little"), b"{{{{", 100)
