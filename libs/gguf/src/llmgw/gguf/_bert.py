"""A BERT sentence-embedding model from its Hugging Face folder (config.json, model.safetensors,
tokenizer.json, and sentence-transformers' 1_Pooling/config.json) written as a GGUF file that
llama.cpp serves with `--embedding`: the weights as they are (matrices in F16, the rest F32),
its WordPiece vocabulary in llama.cpp's spelling, and its pooling in the header. No torch: the
safetensors file is read with numpy."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

import gguf

__all__ = ["read_safetensors", "write_bert"]

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}
_LEFT_OUT = ("embeddings.position_ids", "pooler.")
"""What an embedding model does not use: the position ids' buffer, the classifier's pooler."""


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file, as numpy arrays over the file (memory-mapped)."""
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    tensors = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path.name}: tensor {name} is {entry['dtype']}, which this reader does not take")
        start, end = entry["data_offsets"]
        tensors[name] = data[start:end].view(dtype).reshape(entry["shape"])
    return tensors


def _pooling(folder: Path) -> gguf.PoolingType:
    said = folder / "1_Pooling" / "config.json"
    if not said.is_file():
        return gguf.PoolingType.CLS  # a plain BERT: its [CLS] token stands for the text
    pooling = json.loads(said.read_text())
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise ValueError(f"{said}: only mean and [CLS] pooling are served (llama.cpp's)")


def _vocab(folder: Path) -> tuple[list[str], list[int]]:
    """Tokens by id in llama.cpp's WordPiece spelling (a word's start marked with U+2581, a
    continuation without its '##', special tokens as they are) and their types."""
    doc = json.loads((folder / "tokenizer.json").read_text())
    if doc["model"]["type"] != "WordPiece":
        raise ValueError(f"{folder / 'tokenizer.json'}: a {doc['model']['type']} tokenizer, not BERT's WordPiece")
    by_id = {i: token for token, i in doc["model"]["vocab"].items()}
    special = {t["content"] for t in doc.get("added_tokens", []) if t.get("special")}
    tokens, types = [], []
    for i in range(max(by_id) + 1):
        token = by_id.get(i, f"[PAD{i}]")
        if token in special:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(token[2:] if token.startswith("##") else "\u2581" + token)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def write_bert(folder: Path, out: Path) -> Path:
    """Write the BERT model in `folder` (a Hugging Face repo's files) as GGUF at `out`."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "bert":
        raise ValueError(f"{folder / 'config.json'}: model_type {config.get('model_type')!r}, not 'bert'")
    layers = int(config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, layers)
    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name(config.get("_name_or_path") or folder.name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(layers)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_pooling_type(_pooling(folder))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types = _vocab(folder)
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(writer)
    for name, tensor in read_safetensors(folder / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name.startswith(_LEFT_OUT):
            continue
        to = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if to is None:
            raise ValueError(f"{folder / 'model.safetensors'}: tensor {name} is not one of BERT's")
        matrix = tensor.ndim == 2 and not to.startswith("token_types")
        writer.add_tensor(to, np.asarray(tensor, dtype=np.float16 if matrix else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
