"""Write a small llama-architecture GGUF with random weights that llama-server loads and runs.

Its answers are noise: it proves the path (load, slots, streaming, usage), not a model.
The vocabulary is SentencePiece-style: <unk>, <s>, </s> and the 256 byte tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import numpy as np

import gguf

__all__ = ["TinyLlama", "write_random_llama"]

_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyLlama(msgspec.Struct, frozen=True, kw_only=True):
    """Shape of the random model."""

    embedding: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    feed_forward: int = 128
    context: int = 4096
    seed: int = 0


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    scores = [0.0] * len(tokens)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    return tokens, scores, [int(t) for t in types]


def write_random_llama(path: Path, shape: TinyLlama = TinyLlama()) -> Path:
    """Write the model to `path` atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    rng = np.random.default_rng(shape.seed)
    tokens, scores, types = _vocab()
    n_vocab, d, head_dim = len(tokens), shape.embedding, shape.embedding // shape.heads

    def weight(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("llmgw demo: random weights, answers are noise")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(_CHATML)
    writer.add_tensor("token_embd.weight", weight(n_vocab, d))
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, d))
    for i in range(shape.layers):
        b = f"blk.{i}."
        writer.add_tensor(b + "attn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(b + "attn_q.weight", weight(d, d))
        writer.add_tensor(b + "attn_k.weight", weight(shape.kv_heads * head_dim, d))
        writer.add_tensor(b + "attn_v.weight", weight(shape.kv_heads * head_dim, d))
        writer.add_tensor(b + "attn_output.weight", weight(d, d))
        writer.add_tensor(b + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(b + "ffn_gate.weight", weight(shape.feed_forward, d))
        writer.add_tensor(b + "ffn_up.weight", weight(shape.feed_forward, d))
        writer.add_tensor(b + "ffn_down.weight", weight(d, shape.feed_forward))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path
