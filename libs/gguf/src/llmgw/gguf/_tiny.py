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
    head_dim: int = 0
    """Per-head key and value length; 0 is embedding / heads (written explicitly otherwise)."""
    experts: int = 0
    """Routed experts per layer (0: a dense model)."""
    experts_used: int = 0
    """Experts each token uses."""
    tensor_type: str = "F32"
    """The matrices' type (norms stay F32): F32, F16, Q8_0, Q4_0, Q4_1 and Q5_0 quantised from
    random weights; Q4_K, Q5_K and Q6_K written as random blocks (their rows a multiple of 256)."""
    split_tensors: int = 0
    """Write parts of at most this many tensors (`-00001-of-0000N.gguf`); 0 is one file."""


_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
}
_SCALES = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
"""Where each block of a quantised type holds its f16 scales (and minimums), as ggml lays its
blocks out. Their blocks are random bytes with small, finite scales: gguf quantises none of the
K types, and the others only slowly (numpy: 11 of the 12.5 s `plan calibrate` spent writing its
models)."""


def _random_blocks(rng: np.random.Generator, dims: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """A tensor of `dims` weights of quantised type `qtype` as random blocks (the bytes gguf writes)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if dims[-1] % block:
        raise ValueError(f"a {qtype.name} row holds a multiple of {block} weights, not {dims[-1]}")
    blocks = rng.integers(0, 256, size=(*dims[:-1], dims[-1] // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)
    for at in _SCALES[qtype.name]:
        blocks[..., at : at + 2] = scale
    return blocks.reshape(*dims[:-1], -1)


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    scores = [0.0] * len(tokens)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    return tokens, scores, [int(t) for t in types]


def write_random_llama(path: Path, shape: TinyLlama = TinyLlama()) -> Path:
    """Write the model to `path` atomically (a temporary file renamed into place).

    With `split_tensors` the parts are written beside it as `<stem>-0000i-of-0000n.gguf`
    (not atomically) and the first part's path is returned.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    split = shape.split_tensors > 0
    tmp = path if split else path.with_name(f".{path.name}.{os.getpid()}.part")
    rng = np.random.default_rng(shape.seed)
    tokens, scores, types = _vocab()
    n_vocab, d = len(tokens), shape.embedding
    head_dim = shape.head_dim or shape.embedding // shape.heads
    qtype = gguf.GGMLQuantizationType[shape.tensor_type]

    def weight(*dims: int):
        if qtype.name in _SCALES:
            return {"tensor": _random_blocks(rng, dims, qtype), "raw_dtype": qtype}
        data = rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)
        if qtype == gguf.GGMLQuantizationType.F32:
            return {"tensor": data}
        if qtype == gguf.GGMLQuantizationType.F16:
            return {"tensor": data.astype(np.float16)}
        return {"tensor": gguf.quants.quantize(data, qtype), "raw_dtype": qtype}

    writer = gguf.GGUFWriter(str(tmp), "llama", split_max_tensors=shape.split_tensors)
    writer.add_name("llmgw demo: random weights, answers are noise")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    if shape.head_dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(_FILE_TYPES[shape.tensor_type])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(_CHATML)
    ff, q_width, kv_width = shape.feed_forward, shape.heads * head_dim, shape.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", **weight(n_vocab, d))
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", **weight(n_vocab, d))
    for i in range(shape.layers):
        b = f"blk.{i}."
        writer.add_tensor(b + "attn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(b + "attn_q.weight", **weight(q_width, d))
        writer.add_tensor(b + "attn_k.weight", **weight(kv_width, d))
        writer.add_tensor(b + "attn_v.weight", **weight(kv_width, d))
        writer.add_tensor(b + "attn_output.weight", **weight(d, q_width))
        writer.add_tensor(b + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        if shape.experts:
            writer.add_tensor(
                b + "ffn_gate_inp.weight", (rng.standard_normal((shape.experts, d)) * 0.02).astype(np.float32)
            )
            writer.add_tensor(b + "ffn_gate_exps.weight", **weight(shape.experts, ff, d))
            writer.add_tensor(b + "ffn_up_exps.weight", **weight(shape.experts, ff, d))
            writer.add_tensor(b + "ffn_down_exps.weight", **weight(shape.experts, d, ff))
        else:
            writer.add_tensor(b + "ffn_gate.weight", **weight(ff, d))
            writer.add_tensor(b + "ffn_up.weight", **weight(ff, d))
            writer.add_tensor(b + "ffn_down.weight", **weight(d, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split:
        return path.with_name(f"{path.stem}-00001-of-{len(writer.tensors):05d}.gguf")
    os.replace(tmp, path)
    return path
