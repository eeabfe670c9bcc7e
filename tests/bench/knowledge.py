"""Knowledge bases and the answer cache, measured (`python tests/bench/knowledge.py [--chunks N]`):

1. Embedding throughput: all-MiniLM-L6-v2 as llmgw serves it (its GGUF written by
   `llmgw.gguf.write_bert`, llama-server `--embedding`, 2 threads, batches of 16) beside
   sentence-transformers running the same model from the same files on the same CPU (torch, 2
   threads, batches of 16), on the same texts, taking turns.
2. Retrieval quality: recall@5 and MRR@10 of llmgw's retrieval (those vectors in the same
   `BaseIndex` the router searches) beside BM25 (`bm25s`), over a corpus made of the docstrings
   of 20 modules of CPython's standard library (every public function defined in each: the
   public text Python ships) and the 45 questions of tests/fixtures/knowledge-questions.json,
   written by hand in other words than the docstrings', each naming the one function answering it.
3. Index scale: `--chunks` (1,000,000) chunks in 1,000 documents of 384 numbers (clustered
   around 1,000 centres) kept in JetStream as the router keeps them, then one router's rebuild of
   its index from there (the `Follower`'s own pass), its memory, and queries (a chunk's vector
   moved a little) with usearch's graph beside an exact numpy scan: p50/p99, the graph's
   recall@10 against the scan, and how often the chunk a query was made from is in its 10.
4. Answer cache: hit rate on paraphrases and wrong-hit rate on different questions of the same
   topic (the fixture's 30 triples), at three thresholds.
5. A hit beside a miss, through the router: `llmgw up` (its demo SmolLM2) with MiniLM served
   beside it and the default tenant's answers to smollm2 kept; the 30 questions asked (misses:
   the model answers, up to 48 tokens), then their paraphrases (hits where the cache answers).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bm25s
import httpx
import msgspec
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]

from gateway_peers import Unavailable, _venv_tool  # noqa: E402

from llmgw.bus import find_llamacpp, free_port, start_nats_server  # noqa: E402
from llmgw.gguf import write_bert  # noqa: E402
from llmgw.proto.knowledge import Chunks, Document, KnowledgeBase  # noqa: E402
from llmgw.router.knowledge.index import BaseIndex  # noqa: E402
from llmgw.router.knowledge.ingest import Follower  # noqa: E402
from llmgw.router.knowledge.store import Knowledge, chunks_name, doc_key  # noqa: E402
from tests.embeddings import minilm_folder  # noqa: E402

FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "knowledge-questions.json").read_text())
MODULES = (
    "shutil", "os", "posixpath", "json", "re", "itertools", "functools", "statistics", "random", "math",
    "heapq", "bisect", "textwrap", "fnmatch", "glob", "tempfile", "base64", "urllib.parse", "subprocess", "time",
)  # fmt: skip
ST = "sentence-transformers==6.2.0"
BATCH = 16


def corpus() -> dict[str, str]:
    """id (`module.function`) -> its docstring's first 120 words, for every public function (and
    class) a module of `MODULES` defines or exports (its C part's too: `_heapq` for heapq)."""
    out: dict[str, str] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        exported = set(getattr(module, "__all__", ()))
        for attr, obj in vars(module).items():
            kinds = (inspect.isfunction, inspect.isbuiltin, inspect.ismethod, inspect.isclass)
            if attr.startswith("_") or not any(kind(obj) for kind in kinds) or not (obj.__doc__ or "").strip():
                continue
            if getattr(obj, "__module__", None) not in (name, f"_{name}", None) and attr not in exported:
                continue
            words = obj.__doc__.split()[:120]
            out.setdefault(f"{name}.{obj.__name__}", f"{name}.{obj.__name__}: " + " ".join(words))
    return out


class Engine:
    """llama-server serving the GGUF with `--embedding`, as the agent starts an embedding model
    (2 slots, each with the model's whole context)."""

    def __init__(self, gguf: Path, log: Path) -> None:
        self.port = free_port()
        argv = [find_llamacpp().server, "-m", str(gguf), "--embedding", "--port", str(self.port), "-t", "2"]
        self.proc = subprocess.Popen([*argv, "-c", "1024", "-np", "2"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"llama-server did not start: {log.read_text()[-500:]}")

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        with httpx.Client(timeout=300) as http:
            for i in range(0, len(texts), BATCH):
                answer = http.post(f"{self.url}/v1/embeddings", json={"input": texts[i : i + BATCH]})
                answer.raise_for_status()
                rows += [d["embedding"] for d in sorted(answer.json()["data"], key=lambda d: d["index"])]
        vectors = np.asarray(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


_ST_SCRIPT = """
import json, sys, time, torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(2)
model = SentenceTransformer(sys.argv[1], device="cpu")
texts = json.load(open(sys.argv[2]))
model.encode(texts[:32], batch_size=16)
started = time.perf_counter()
model.encode(texts, batch_size=16)
print(json.dumps({"seconds": time.perf_counter() - started, "torch": torch.__version__}))
"""


def throughput(engine: Engine, folder: Path, texts: list[str], work: Path) -> list[tuple[str, float, str]]:
    """Chunks a second: llmgw's engine and sentence-transformers, taking turns, each its best of 2."""
    try:
        python = _venv_tool("sentence-transformers", ST, "python")
    except Unavailable as exc:
        python, why = None, str(exc)
    (work / "texts.json").write_text(json.dumps(texts))
    (work / "st.py").write_text(_ST_SCRIPT)
    ours, theirs, version = [], [], ""
    engine.embed(texts[:32])
    for _ in range(2):
        started = time.perf_counter()
        engine.embed(texts)
        ours.append(len(texts) / (time.perf_counter() - started))
        if python is not None:
            env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
            done = subprocess.run(
                [str(python), str(work / "st.py"), str(folder), str(work / "texts.json")],
                capture_output=True, text=True, env=env, timeout=900,
            )  # fmt: skip
            if done.returncode:
                python, why = None, done.stderr[-300:]
            else:
                said = json.loads(done.stdout.strip().splitlines()[-1])
                theirs.append(len(texts) / said["seconds"])
                version = f"sentence-transformers 6.2.0, torch {said['torch']}"
    rows = [("llmgw (llama-server --embedding, F16)", max(ours), "2 threads")]
    rows.append((version or f"sentence-transformers: {why}", max(theirs) if theirs else float("nan"), "2 threads"))
    return rows


def quality(engine: Engine, docs: dict[str, str]) -> list[tuple[str, float, float]]:
    """recall@5 and MRR@10 of llmgw's retrieval and of BM25 on the fixture's questions."""
    ids, texts = list(docs), list(docs.values())
    questions = FIXTURE["retrieval"]
    index = BaseIndex(384, "minilm")
    index.put("corpus", "", texts, engine.embed(texts))
    asked = engine.embed([q["question"] for q in questions])
    ours = [[ids[f.chunk] for f in index.search(v, 10)] for v in asked]
    bm25 = bm25s.BM25()
    bm25.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    found, _ = bm25.retrieve(
        bm25s.tokenize([q["question"] for q in questions], stopwords="en", show_progress=False),
        k=10,
        show_progress=False,
    )
    theirs = [[ids[i] for i in row] for row in found.tolist()]
    rows = []
    for name, ranked in (("llmgw (MiniLM + usearch)", ours), ("BM25 (bm25s)", theirs)):
        answers = [q["answer"] for q in questions]
        recall = np.mean([a in r[:5] for a, r in zip(answers, ranked, strict=True)])
        mrr = np.mean([1 / (r.index(a) + 1) if a in r else 0.0 for a, r in zip(answers, ranked, strict=True)])
        rows.append((name, float(recall), float(mrr)))
    return rows


def cache_rates(engine: Engine) -> list[tuple[float, float, float]]:
    """(threshold, hit rate on paraphrases, wrong-hit rate on different questions)."""
    triples = FIXTURE["cache"]
    kept = engine.embed([f"user: {t['question']}" for t in triples])
    index = BaseIndex(384, "minilm")
    index.put("kept", "", [t["question"] for t in triples], kept)
    rows = []
    paraphrases = engine.embed([f"user: {t['paraphrase']}" for t in triples])
    different = engine.embed([f"user: {t['different']}" for t in triples])
    for threshold in (0.85, 0.9, 0.95):
        hits = [f for v in paraphrases for f in index.search(v, 1)]
        right = np.mean([f.chunk == i and f.score >= threshold for i, f in enumerate(hits)])
        wrong = np.mean([f.score >= threshold for v in different for f in index.search(v, 1)])
        rows.append((threshold, float(right), float(wrong)))
    return rows


async def index_scale(chunks: int, work: Path) -> dict[str, float]:
    """`chunks` chunks kept in JetStream in 1,000 documents, one router's index rebuilt from them."""
    server = start_nats_server(work / "nats", free_port())
    try:
        import nats

        nc = await nats.connect(server.url)
        knowledge = await Knowledge.open(nc.jetstream(), nc, lambda _: None)
        knowledge.model_version = lambda _: "minilm@bench"
        base = KnowledgeBase(name="big", tenant="t", embedding="minilm")
        await knowledge.bases.kv.put("t.big", msgspec.json.encode(base))
        rng = np.random.default_rng(7)
        centres = rng.standard_normal((1000, 384)).astype(np.float32)
        per, started = chunks // 1000, time.perf_counter()
        sample, sources = [], []
        for d in range(1000):
            rows = centres[rng.integers(0, 1000, per)] + 0.6 * rng.standard_normal((per, 384)).astype(np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            if d % 10 == 0:
                sample.append(rows[:20])
                sources += [f"chunk {d}.{i}" for i in range(20)]
            key = doc_key("t", "big", f"doc{d}.md")
            kept = Chunks(
                sha256=f"{d}",
                embedded_with="minilm@bench",
                texts=[f"chunk {d}.{i}" for i in range(per)],
                dim=384,
                vectors=rows.astype("<f4").tobytes(),
            )
            await knowledge.chunk_store.put(chunks_name(key, f"{d}"), msgspec.msgpack.encode(kept))
            doc = Document(
                tenant="t",
                base="big",
                path=f"doc{d}.md",
                sha256=f"{d}",
                size=1,
                format="markdown",
                state="ready",
                chunks=per,
                embedded_with="minilm@bench",
            )
            await knowledge.docs.kv.put(key, msgspec.json.encode(doc))
        stored = time.perf_counter() - started
        while len(knowledge.docs.items) < 1000:
            await asyncio.sleep(0.1)
        before = psutil.Process().memory_info().rss
        started = time.perf_counter()
        await Follower(knowledge).catch_up()
        rebuilt = time.perf_counter() - started
        memory = psutil.Process().memory_info().rss - before
        index = knowledge.indexes[("t", "big")]
        queries = np.concatenate(sample)[:1000] + 0.05 * rng.standard_normal((1000, 384)).astype(np.float32)
        times, own = [], []
        for q, source in zip(queries, sources, strict=False):
            t = time.perf_counter()
            found = index.search(q, 10)
            times.append(time.perf_counter() - t)
            own.append(source in [f.text for f in found])
        keys = np.array(sorted(index.chunks), dtype=np.uint64)
        every = np.asarray(index.index.get(keys), dtype=np.float32)
        exact_times, agree = [], []
        for q in queries[:100]:
            t = time.perf_counter()
            best = keys[np.argsort(-(every @ (q / np.linalg.norm(q))))[:10]]
            exact_times.append(time.perf_counter() - t)
            found = index.index.search(q, 10).keys
            agree.append(len(set(best.tolist()) & set(found.tolist())) / 10)
        await nc.close()
        return {
            "chunks": len(index), "stored_s": stored, "rebuilt_s": rebuilt, "memory_gb": memory / 1e9,
            "p50_ms": 1000 * float(np.percentile(times, 50)), "p99_ms": 1000 * float(np.percentile(times, 99)),
            "exact_p50_ms": 1000 * float(np.percentile(exact_times, 50)),
            "exact_p99_ms": 1000 * float(np.percentile(exact_times, 99)),
            "recall10": float(np.mean(agree)),
            "own10": float(np.mean(own)),
        }  # fmt: skip
    finally:
        server.stop()


async def through_router(gguf: Path, work: Path) -> dict[str, list[float]]:
    """Each question's time through `llmgw up`'s router, as a miss and (its paraphrase) a hit."""
    from first_answer import start_up

    from llmgw.bus import BusError, call, connect
    from llmgw.ctl.demo import mirror_config
    from llmgw.proto import catalog, knowledge
    from llmgw.proto.catalog import ServeModel

    home = work / "up"
    proc, base, key, nats_url = start_up(home)
    try:
        # the mirror takes MiniLM in as it takes the demo: an import in its config, read when
        # it starts again (`up` starts it again once it is stopped)
        sha256 = hashlib.sha256(gguf.read_bytes()).hexdigest()
        taken = {"path": str(gguf), "source": "bench/minilm/minilm.gguf", "sha256": sha256}
        config = home / "up" / "mirror.toml"
        config.write_text(config.read_text() + "\n" + mirror_config([taken]))
        for child in psutil.Process(proc.pid).children(recursive=True):
            if "mirror" in child.cmdline() and "service" in child.cmdline():
                child.terminate()
        nc = await connect(nats_url, "bench", creds=str(home / "creds" / "ctl.nk"))
        serve = ServeModel(source=taken["source"], name="minilm", cpu=True, cpu_anyway=True)
        for _ in range(600):
            try:
                await call(nc, catalog.SERVE, serve)
                break
            except BusError:  # the mirror not back, or not done checking it
                await asyncio.sleep(0.5)
        await call(nc, knowledge.CACHE_PUT, knowledge.AnswerCache(model="smollm2", embedding="minilm"))
        await nc.close()
        times: dict[str, list[float]] = {"miss": [], "hit": []}
        async with httpx.AsyncClient(timeout=300, headers={"authorization": f"Bearer {key}"}) as http:
            while (await http.post(f"{base}/embeddings", json={"model": "minilm", "input": "x"})).status_code != 200:
                await asyncio.sleep(0.5)
            for field in ("question", "paraphrase"):
                for triple in FIXTURE["cache"]:
                    body = {"model": "smollm2", "max_tokens": 48, "temperature": 0}
                    body["messages"] = [{"role": "user", "content": triple[field]}]
                    started = time.perf_counter()
                    answer = await http.post(f"{base}/chat/completions", json=body)
                    took = time.perf_counter() - started
                    answer.raise_for_status()
                    times["hit" if answer.headers.get("llmgw-cache", "").startswith("hit") else "miss"].append(took)
                await asyncio.sleep(1.0)  # the answers kept
        return times
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000, help="chunks in the index-scale part")
    parser.add_argument("--part", type=int, choices=range(1, 6), action="append", help="only these parts (repeat)")
    args = parser.parse_args()
    parts = set(args.part or range(1, 6))
    work = Path(tempfile.mkdtemp(prefix="llmgw-kb-bench-"))
    folder = minilm_folder(work)
    gguf = write_bert(folder, work / "minilm.gguf")
    if parts & {1, 2, 4}:
        engine = Engine(gguf, work / "llama-server.log")
        try:
            _engine_parts(engine, folder, work, parts)
        finally:
            engine.stop()
    if 3 in parts:
        _report_scale(asyncio.run(index_scale(args.chunks, work)))
    if 5 in parts:
        times = asyncio.run(through_router(gguf, work))
        print("\nthrough the router (llmgw up, SmolLM2 answering up to 48 tokens, MiniLM embedding)")
        print(f"{'answered':28} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for kind in ("miss", "hit"):
            got = times[kind] or [float("nan")]
            p50, p99 = 1000 * np.percentile(got, 50), 1000 * np.percentile(got, 99)
            said = kind + (" (the model)" if kind == "miss" else " (the cache)")
            print(f"{said:28} {len(times[kind]):8} {p50:8.1f} {p99:8.1f}")


def _engine_parts(engine: Engine, folder: Path, work: Path, parts: set[int]) -> None:
    docs = corpus()
    missing = [q["answer"] for q in FIXTURE["retrieval"] if q["answer"] not in docs]
    assert not missing, f"answers not in the corpus: {missing}"
    print(
        f"corpus: {len(docs)} docstrings of {len(MODULES)} standard library modules (Python {sys.version.split()[0]})"
    )
    if 1 in parts:
        print(f"\nembedding throughput, {len(docs)} chunks, batches of {BATCH}, best of 2 turns")
        print(f"{'engine':52} {'chunks/s':>9}")
        for name, rate, _ in throughput(engine, folder, list(docs.values()), work):
            print(f"{name:52} {rate:9.1f}")
    if 2 in parts:
        print(f"\nretrieval, {len(FIXTURE['retrieval'])} questions")
        print(f"{'retriever':28} {'recall@5':>8} {'MRR@10':>7}")
        for name, recall, mrr in quality(engine, docs):
            print(f"{name:28} {recall:8.3f} {mrr:7.3f}")
    if 4 in parts:
        print(f"\nanswer cache, {len(FIXTURE['cache'])} questions kept, each asked again paraphrased and changed")
        print(f"{'threshold':>9} {'hit rate':>9} {'wrong hits':>10}")
        for threshold, right, wrong in cache_rates(engine):
            print(f"{threshold:9.2f} {right:9.3f} {wrong:10.3f}")


def _report_scale(scale: dict[str, float]) -> None:
    print(f"\nindex scale: {scale['chunks']:,} chunks of 384 numbers in 1,000 documents")
    print(
        f"kept in JetStream in {scale['stored_s']:.1f} s; one router's index rebuilt from it in "
        f"{scale['rebuilt_s']:.1f} s, its memory +{scale['memory_gb']:.2f} GB"
    )
    print(f"{'search':28} {'p50 ms':>7} {'p99 ms':>7} {'recall@10':>9} {'own chunk in 10':>15}")
    graph = f"{scale['p50_ms']:7.2f} {scale['p99_ms']:7.2f} {scale['recall10']:9.3f} {scale['own10']:15.3f}"
    print(f"{'usearch graph (the index)':28} {graph}")
    print(f"{'numpy exact scan':28} {scale['exact_p50_ms']:7.2f} {scale['exact_p99_ms']:7.2f} {1.0:9.3f} {1.0:15.3f}")


if __name__ == "__main__":
    main()
