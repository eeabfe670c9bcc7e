"""What a gateway adds: the same streaming load against a backend directly, through llmgw's
router, and through LiteLLM's proxy, in one run (goal: added p50 under 1 ms, p99 under 5 ms,
and more requests a second than LiteLLM on the same core).

The backend is a stub OpenAI server (this file, `--stub`): it streams 16 fixed chunks and the
usage chunk at once, so what is measured is the gateways, not an engine. Each gateway runs as
one process pinned to core 1 (`taskset`); the stub and the load (many concurrent streaming
clients, httpx) share core 0. A second llmgw row uses a key with limits
(requests, tokens a minute, in flight, a daily budget: counted in KV on every request), a third
the same with NATS as a cluster runs it (each service its nkey and permissions, TLS): what
authorization and encryption cost the one path that crosses NATS per request.
LiteLLM (`litellm[proxy]`) is installed on first use into its own environment under
~/.cache/llmgw/litellm. Run with `just bench`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmgw.bus import free_port, start_nats_server

LITELLM = "litellm[proxy]==1.108.7"
LITELLM_ENV = Path.home() / ".cache" / "llmgw" / "litellm"
CHUNKS = 16
LATENCY = (1, 500)
"""One client at a time: what the gateway adds to each request, without queueing."""
THROUGHPUT = (32, 2000)
"""32 concurrent clients: requests a second the gateway sustains."""


# -- the stub backend ---------------------------------------------------------------------------
async def _stub(port: int) -> None:
    words = [
        json.dumps(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}],
            }
        )
        for i in range(CHUNKS)
    ]
    usage = json.dumps(
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 8, "completion_tokens": CHUNKS, "total_tokens": 8 + CHUNKS},
        }
    )
    body = "".join(f"data: {w}\n\n" for w in [*words, usage]) + "data: [DONE]\n\n"
    chunked = f"{len(body.encode()):x}\r\n".encode() + body.encode() + b"\r\n0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"connection: keep-alive\r\n\r\n"
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(head + chunked)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# -- the load -----------------------------------------------------------------------------------
async def load(url: str, key: str, clients: int, requests: int) -> tuple[list[float], float]:
    """`requests` streaming chat requests from `clients` concurrent clients; each one's seconds
    to [DONE], and the requests a second over the whole run."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": CHUNKS}
    times: list[float] = []
    todo = iter(range(requests))
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients), timeout=60) as http:

        async def client() -> None:
            for _ in todo:
                t = time.perf_counter()
                async with http.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
                    assert r.status_code == 200, (r.status_code, await r.aread())
                    done = False
                    async for line in r.aiter_lines():  # read whole: the connection is kept for the next
                        done = done or line == "data: [DONE]"
                    assert done
                times.append(time.perf_counter() - t)

        for _ in range(50):  # warm up the connections
            async with http.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
                await r.aread()
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return times, requests / (time.perf_counter() - start)


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} never answered")


def pinned(argv: list[str], core: int, **kw) -> subprocess.Popen:
    prefix = ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    return subprocess.Popen(prefix + argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


# -- llmgw's router ------------------------------------------------------------------------------
def secured_nats(tmp: Path) -> tuple[object, str, dict[str, str]]:
    """A nats-server as a cluster runs it: nkeys with each role's permissions and TLS (a CA and a
    certificate made with openssl, as docs/security.md does). Its tls:// URL, and the flags that
    sign in as the router and as the bench (the operator, unrestricted to write the buckets)."""
    from llmgw.bus import TlsFiles, new_identity, server_config, write_identity

    tls = tmp / "tls"
    tls.mkdir(parents=True)
    ssl = ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subprocess.run(
        [*ssl, "-x509", "-days", "2", "-subj", "/CN=bench CA", "-keyout", tls / "ca-key.pem", "-out", tls / "ca.pem"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*ssl, "-subj", "/CN=nats", "-keyout", tls / "key.pem", "-out", tls / "req.csr"], check=True)
    subprocess.run(
        ["openssl", "x509", "-req", "-in", tls / "req.csr", "-CA", tls / "ca.pem", "-CAkey", tls / "ca-key.pem"]
        + ["-CAcreateserial", "-days", "2", "-out", tls / "cert.pem", "-extfile", "/dev/stdin"],
        input=b"subjectAltName=IP:127.0.0.1\n",
        check=True,
        capture_output=True,
    )
    router, bench = new_identity("router"), new_identity("ctl")
    write_identity(tmp / "router.nk", router)
    write_identity(tmp / "bench.nk", bench)
    port = free_port()
    files = TlsFiles(cert=str(tls / "cert.pem"), key=str(tls / "key.pem"), ca=str(tls / "ca.pem"))
    conf = tmp / "server.conf"
    conf.write_text(server_config([router], tmp / "js", port=port, tls=files, unrestricted=(bench.public,)))
    nats = start_nats_server(tmp / "nats", port=port, config=conf)
    url = f"tls://127.0.0.1:{port}"
    flags = {"router": str(tmp / "router.nk"), "bench": str(tmp / "bench.nk"), "ca": files.ca}
    return nats, url, flags


def start_router(
    tmp: Path, backends: str | list[str], limits=None, secure: bool = False
) -> tuple[subprocess.Popen, str, str, object]:
    """llmgw's router as its own process on its own NATS, with one replica of model "m" on each
    backend; the key it returns has `limits` (a `Limits`; None: none). `secure`: NATS with nkeys
    and TLS, as in a cluster."""
    import msgspec

    from llmgw.bus import call, connect, kv_bucket
    from llmgw.proto import BUCKETS, CatalogRecord, KeyCreate, Model, Profile, ReplicaState
    from llmgw.proto import router as router_api

    if secure:
        nats, url, creds = secured_nats(tmp)
        signin = ["--creds", creds["router"], "--tls-ca", creds["ca"]]
    else:
        nats = start_nats_server(tmp / "nats")
        url, creds, signin = nats.url, {"bench": "", "ca": ""}, []
    port = free_port()
    proc = pinned(
        [
            sys.executable,
            "-m",
            "llmgw.router.service",
            "--nats-url",
            url,
            *signin,
            "--http-port",
            str(port),
            "--admin-port",
            "0",
            "--log-level",
            "warning",
            "--data-dir",
            str(tmp / "router"),
        ],
        1,
    )

    async def setup() -> str:
        nc = await connect(url, "bench", creds=creds["bench"], tls_ca=creds["ca"])
        js = nc.jetstream()
        model = Model(name="m", source="o/r/m.gguf", context=8192, profiles=[Profile(name="cpu", slots=2)])
        await (await kv_bucket(js, BUCKETS["catalog"], 5)).put("m", msgspec.json.encode(CatalogRecord(model=model)))
        replicas = await kv_bucket(js, BUCKETS["replicas"])
        for i, backend_url in enumerate([backends] if isinstance(backends, str) else backends):
            replica = ReplicaState(id=f"r{i}", model="m", profile="cpu", node="n", state="ready", url=backend_url)
            await replicas.put(replica.id, msgspec.json.encode(replica))
        for _ in range(100):
            try:
                create = KeyCreate(name="bench", **({"limits": limits} if limits else {}))
                key = (await call(nc, router_api.KEY_CREATE, create)).key
                break
            except Exception:
                await asyncio.sleep(0.2)
        await nc.close()
        return key

    key = asyncio.run(setup())
    wait_http(f"http://127.0.0.1:{port}/v1/models")
    return proc, f"http://127.0.0.1:{port}/v1/chat/completions", key, nats


# -- LiteLLM's proxy -----------------------------------------------------------------------------
def litellm_binary() -> Path | None:
    binary = LITELLM_ENV / "bin" / "litellm"
    if not binary.exists():
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        print(f"installing {LITELLM} into {LITELLM_ENV} (once)", file=sys.stderr)
        made = subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(LITELLM_ENV)])
        env = {**os.environ, "VIRTUAL_ENV": str(LITELLM_ENV)}
        if made.returncode or subprocess.run([uv, "pip", "install", "-q", LITELLM], env=env).returncode:
            return None
    return binary


def start_litellm(tmp: Path, backend: str) -> tuple[subprocess.Popen, str] | None:
    binary = litellm_binary()
    if binary is None:
        return None
    config = tmp / "litellm.yaml"
    config.write_text(
        f"model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
        f"      api_base: {backend}/v1\n      api_key: k\n"
    )
    port = free_port()
    proc = pinned(
        [str(binary), "--config", str(config), "--port", str(port), "--num_workers", "1"],
        1,
        env={**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": MASTER_KEY},
    )
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout=180)
    return proc, f"http://127.0.0.1:{port}/v1/chat/completions"


MASTER_KEY = "sk-bench-" + "0" * 32
"""LiteLLM refuses to start without a master key; requests use it (no database: no virtual keys)."""


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--stub":
        asyncio.run(_stub(int(sys.argv[2])))
        return
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-gateway-"))
    stub_port = free_port()
    backend = f"http://127.0.0.1:{stub_port}"
    stub = pinned([sys.executable, __file__, "--stub", str(stub_port)], 0)
    procs = [stub]
    rows = {}
    try:
        wait_http(backend)
        rows["backend directly"] = measure(f"{backend}/v1/chat/completions", "k")
        router, url, key, nats = start_router(tmp, backend)
        procs.append(router)
        rows["llmgw router"] = measure(url, key)
        router.terminate()
        nats.stop()
        from llmgw.proto import Limits

        limited = Limits(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent=10**6, tokens_per_day=10**15)
        router, url, key, nats = start_router(tmp / "limited", backend, limited)
        procs.append(router)
        rows["llmgw, key limits"] = measure(url, key)
        router.terminate()
        nats.stop()
        router, url, key, nats = start_router(tmp / "secured", backend, limited, secure=True)
        procs.append(router)
        rows["  + nkeys and TLS"] = measure(url, key)
        router.terminate()
        nats.stop()
        started = start_litellm(tmp, backend)
        if started:
            procs.append(started[0])
            rows["LiteLLM proxy"] = measure(started[1], MASTER_KEY)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows["backend directly"][0]
    print(
        f"streaming chat requests ({CHUNKS} chunks + usage); latency: {LATENCY[1]} requests one at a time; "
        f"throughput: {THROUGHPUT[1]} from {THROUGHPUT[0]} concurrent clients; each gateway on one core"
    )
    print(f"{'':18}{'p50 ms':>8}{'p99 ms':>8}{'added p50':>11}{'added p99':>11}{'req/s':>8}")
    for name, (times, rps) in rows.items():
        p50, p99 = pct(times, 50) * 1000, pct(times, 99) * 1000
        add50, add99 = p50 - pct(base, 50) * 1000, p99 - pct(base, 99) * 1000
        print(f"{name:18}{p50:8.2f}{p99:8.2f}{add50:11.2f}{add99:11.2f}{rps:8.0f}")
    if "LiteLLM proxy" in rows:
        print(f"llmgw / LiteLLM requests a second: {rows['llmgw router'][1] / rows['LiteLLM proxy'][1]:.1f}x")
    else:
        print("LiteLLM could not be installed here: no comparison this run")


def measure(url: str, key: str) -> tuple[list[float], float]:
    """Latencies one request at a time, and requests a second under concurrent load."""
    times, _ = asyncio.run(load(url, key, *LATENCY))
    _, rps = asyncio.run(load(url, key, *THROUGHPUT))
    return times, rps


if __name__ == "__main__":
    main()
