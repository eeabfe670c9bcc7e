"""GGUF headers of files written here with `gguf`: every fact read, every broken file refused."""

import struct

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.gguf import GGUFError, TinyLlama, bytes_per_weight, read_header, read_model, split_parts, write_random_llama


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return {
        "dense": write_random_llama(d / "dense.gguf", TinyLlama(heads=4, kv_heads=4)),
        "gqa": write_random_llama(d / "gqa.gguf", TinyLlama(heads=4, kv_heads=2)),
        "head": write_random_llama(d / "head.gguf", TinyLlama(heads=4, kv_heads=2, head_dim=32)),
        "experts": write_random_llama(d / "experts.gguf", TinyLlama(experts=8, experts_used=2, tensor_type="Q8_0")),
        "f16": write_random_llama(d / "f16.gguf", TinyLlama(tensor_type="F16")),
        "q8": write_random_llama(d / "q8.gguf", TinyLlama(tensor_type="Q8_0")),
        "q5": write_random_llama(d / "q5.gguf", TinyLlama(tensor_type="Q5_0")),
        "q4k": write_random_llama(d / "q4k.gguf", TinyLlama(embedding=256, feed_forward=512, tensor_type="Q4_K")),
        "q6k": write_random_llama(d / "q6k.gguf", TinyLlama(embedding=256, feed_forward=512, tensor_type="Q6_K")),
        "split": write_random_llama(d / "split.gguf", TinyLlama(split_tensors=8)),
    }


def test_a_dense_model_says_its_shape_vocabulary_and_template(files):
    h = read_header(files["dense"])
    assert (h.architecture, h.block_count, h.embedding_length, h.head_count, h.head_count_kv) == ("llama", 2, 64, 4, 4)
    assert (h.key_length, h.value_length, h.context_length, h.vocab_size) == (16, 16, 4096, 259)
    assert h.file_type == "F32" and h.type_bytes == {"F32": h.tensor_bytes} and h.tensor_bytes == 4 * h.parameters
    assert "<|im_start|>" in h.chat_template and not h.embedding and h.split_count == 1
    assert h.expert_bytes == 0 and h.active_bytes == h.tensor_bytes
    assert h.header_bytes % 32 == 0 and h.header_bytes + h.tensor_bytes <= files["dense"].stat().st_size


def test_grouped_query_attention_and_an_explicit_key_length_are_read(files):
    assert read_header(files["gqa"]).head_count_kv == 2
    h = read_header(files["head"])
    assert (h.head_count, h.head_count_kv, h.key_length, h.value_length) == (4, 2, 32, 32)


def test_a_model_of_experts_splits_its_bytes_into_what_every_token_reads_and_the_experts(files):
    h = read_header(files["experts"])
    assert (h.expert_count, h.expert_used_count) == (8, 2)
    assert 0 < h.expert_bytes < h.tensor_bytes
    assert h.active_bytes == h.dense_bytes + h.expert_bytes * 2 // 8


@pytest.mark.parametrize(
    ("name", "file_type", "bytes_per_weight"),
    [
        ("f16", "F16", 2.0),
        ("q8", "Q8_0", 34 / 32),
        ("q5", "Q5_0", 22 / 32),
        ("q4k", "Q4_K_M", 144 / 256),
        ("q6k", "Q6_K", 210 / 256),
    ],
)
def test_the_quantisation_is_the_files_and_sizes_follow_the_block_sizes(files, name, file_type, bytes_per_weight):
    h = read_header(files[name])
    assert h.file_type == file_type
    matrices = h.type_bytes[file_type.removesuffix("_M")]
    norms = h.type_bytes.get("F32", 0)
    assert matrices == pytest.approx((h.parameters - norms // 4) * bytes_per_weight)


def test_a_k_type_row_that_is_not_whole_blocks_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="a Q4_K row holds a multiple of 256 weights, not 64"):
        write_random_llama(tmp_path / "m.gguf", TinyLlama(tensor_type="Q4_K"))


def test_a_split_model_is_read_whole_from_its_first_part(files):
    first = files["split"]
    assert first.name == "split-00001-of-00003.gguf"
    parts = split_parts(str(first))
    assert [p.rsplit("/", 1)[1] for p in parts] == [f"split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = read_model(first)
    alone = read_header(first)
    assert whole.split_count == 3 and whole.tensor_count == 21 and alone.tensor_count == 8
    assert whole.tensor_bytes == read_header(files["gqa"]).tensor_bytes  # the same model, in three parts
    assert whole.tensor_bytes > alone.tensor_bytes


def test_a_missing_part_of_a_split_model_is_named(files, tmp_path):
    for part in split_parts(str(files["split"]))[:2]:
        (tmp_path / part.rsplit("/", 1)[1]).write_bytes(open(part, "rb").read())
    with pytest.raises(GGUFError, match="split-00003-of-00003.gguf: No such file"):
        read_model(tmp_path / "split-00001-of-00003.gguf")


def test_a_file_that_is_not_gguf_says_what_it_starts_with(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(GGUFError, match=r"not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        read_header(bad)


@pytest.mark.parametrize(
    ("version", "message"),
    [(1, "GGUF version 1; llmgw reads versions 2, 3"), (0x03000000, "a big-endian GGUF \\(version 3\\)")],
)
def test_a_version_it_does_not_read_is_refused_with_the_version(files, tmp_path, version, message):
    data = bytearray(files["dense"].read_bytes())
    data[4:8] = struct.pack("<I", version)
    bad = tmp_path / "v.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=message):
        read_header(bad)


def test_an_unknown_tensor_type_names_the_tensor(files, tmp_path):
    data = bytearray(files["dense"].read_bytes())
    name = b"output_norm.weight"
    at = data.index(name) + len(name)
    n_dims = struct.unpack("<I", data[at : at + 4])[0]
    type_at = at + 4 + 8 * n_dims
    data[type_at : type_at + 4] = struct.pack("<I", 250)
    bad = tmp_path / "t.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="tensor 'output_norm.weight' has type 250"):
        read_header(bad)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1, exclude_max=True))
def test_a_file_cut_anywhere_is_refused_saying_where(files, tmp_path_factory, cut):
    whole = files["experts"].read_bytes()
    at = int(cut * len(whole))
    bad = tmp_path_factory.mktemp("cut") / "cut.gguf"
    bad.write_bytes(whole[:at])
    with pytest.raises(GGUFError) as info:
        read_header(bad)
    message = str(info.value)
    assert str(bad) in message
    assert f"cut short at byte {at}" in message or "not a GGUF file" in message or f"but it has {at} bytes" in message


def test_a_big_endian_file_written_by_gguf_is_refused_as_such(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "be.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="big-endian"):
        read_header(tmp_path / "be.gguf")


def test_bytes_a_weight_come_from_each_types_block():
    types = ("F32", "F16", "Q8_0", "Q4_K", "Q6_K")
    assert [bytes_per_weight(t) for t in types] == [4, 2, 34 / 32, 144 / 256, 210 / 256]
