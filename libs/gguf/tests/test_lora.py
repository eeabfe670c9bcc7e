"""A LoRA adapter checked against the weights it is for, from the two headers alone, as llama.cpp
checks it when it loads one: the files are written with `gguf`."""

import gguf
import numpy as np
import pytest

from llmgw.gguf import GGUFError, TinyLlama, check_lora, write_random_llama, write_random_lora


@pytest.fixture
def base(tmp_path):
    return write_random_llama(tmp_path / "base.gguf")


def test_an_adapter_made_for_the_weights_fits_them_and_says_its_rank_and_alpha(tmp_path, base):
    adapter = write_random_lora(tmp_path / "a.gguf", base, targets=("attn_q", "attn_v", "ffn_up"), rank=8)
    lora = check_lora(adapter, base)
    assert (lora.architecture, lora.rank, lora.alpha, lora.tensors) == ("llama", 8, 8.0, 6)  # 3 weights x 2 layers


def test_an_adapter_for_other_weights_is_refused_naming_the_weight_that_differs(tmp_path, base):
    wider = write_random_llama(tmp_path / "wider.gguf", TinyLlama(embedding=128))
    adapter = write_random_lora(tmp_path / "a.gguf", wider)
    with pytest.raises(GGUFError, match=r"a.gguf was made for another model: 'blk.0.attn_q.weight' is 64x64 in the"):
        check_lora(adapter, base)


def test_an_adapter_of_a_layer_the_weights_lack_is_refused(tmp_path, base):
    deeper = write_random_llama(tmp_path / "deeper.gguf", TinyLlama(layers=4))
    with pytest.raises(GGUFError, match="adapts 'blk.2.attn_q.weight', which base.gguf does not have"):
        check_lora(write_random_lora(tmp_path / "a.gguf", deeper), base)


def test_a_model_file_is_not_an_adapter(tmp_path, base):
    with pytest.raises(GGUFError, match="base.gguf is not a LoRA adapter: its header says it is a model"):
        check_lora(base, base)


def _adapter(path, arch="llama", kind="lora", tensors=None):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, kind)
    for name, shape in (tensors or {}).items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_adapter_of_another_kind_or_architecture_or_with_half_a_pair_is_refused(tmp_path, base):
    pair = {"blk.0.attn_q.weight.lora_a": (4, 64), "blk.0.attn_q.weight.lora_b": (64, 4)}
    assert check_lora(_adapter(tmp_path / "ok.gguf", tensors=pair), base).tensors == 1
    with pytest.raises(GGUFError, match="is not a LoRA adapter: its header says it is a 'control_vector' adapter"):
        check_lora(_adapter(tmp_path / "cv.gguf", kind="control_vector"), base)
    with pytest.raises(GGUFError, match="qwen.gguf is an adapter for a 'qwen2' model; base.gguf is a 'llama' one"):
        check_lora(_adapter(tmp_path / "qwen.gguf", arch="qwen2", tensors=pair), base)
    half = {"blk.0.attn_q.weight.lora_a": (4, 64)}
    with pytest.raises(GGUFError, match="has no 'blk.0.attn_q.weight.lora_b' beside it; the adapter is damaged"):
        check_lora(_adapter(tmp_path / "half.gguf", tensors=half), base)
    with pytest.raises(GGUFError, match="holds no LoRA pair"):
        check_lora(_adapter(tmp_path / "empty.gguf"), base)
    ranks = {"blk.0.attn_q.weight.lora_a": (4, 64), "blk.0.attn_q.weight.lora_b": (64, 3)}
    with pytest.raises(GGUFError, match="A's rank 4 is not B's 3"):
        check_lora(_adapter(tmp_path / "ranks.gguf", tensors=ranks), base)


def test_a_file_cut_short_is_said_so(tmp_path, base):
    adapter = write_random_lora(tmp_path / "a.gguf", base)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(adapter.read_bytes()[:200])
    with pytest.raises(GGUFError, match="cut short"):
        check_lora(cut, base)
