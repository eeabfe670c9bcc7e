"""The gateways tests/bench/gateway.py measures, and the stub backend behind them.

Each `start_*` starts one gateway as its own process group pinned to `GATEWAY_CORE` and registers
its stop on an ExitStack (a benchmark never leaves a process behind); it returns a `Peer`, or
raises `Unavailable` saying why the peer cannot be installed or does not start here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from llmgw.bus import free_port, start_nats_server

__all__ = [
    "BODY",
    "GATEWAY_CORE",
    "LOAD_CORE",
    "Peer",
    "Unavailable",
    "cpu_seconds",
    "ensure_debian",
    "rss",
    "settle",
    "sse_events",
    "start_backend",
    "start_group",
    "start_litellm",
    "start_nginx",
    "start_portkey",
    "start_python_floor",
    "start_router",
    "start_sglang_router",
    "start_vllm_router",
    "wait_ok",
]

GATEWAY_CORE, LOAD_CORE = 1, 0
"""The gateway alone on one core; the load generator and the backend on the other."""
CACHE = Path.home() / ".cache" / "llmgw"
LITELLM = "litellm[proxy,proxy-runtime]==1.108.7"
"""LiteLLM as its Docker image installs it: `proxy-runtime` is the extra its pyproject keeps for the
image (OpenTelemetry's SDK among it). Without it, every request retries a failing import of
`opentelemetry.sdk` (auth's `_seed_request_destinations`): a fifth of its CPU, profiled."""
VLLM_ROUTER = "vllm-router==0.1.17"
SGLANG_ROUTER = "sglang-router==0.3.2"
CHUNKS = 16
BODY = f'{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{CHUNKS}}}'
"""The chat completion every request posts."""


class Unavailable(Exception):
    """A peer that cannot be installed or does not start here; the message says why."""


@dataclass
class Peer:
    """A running gateway (or the backend): where to post, the key to send, the process to weigh."""

    url: str
    key: str
    pid: int
    headers: dict[str, str] = field(default_factory=dict)
    """More headers every request carries (Portkey's: which provider, where)."""
    prepare: Callable[[], None] | None = None
    """What puts it back where it is measured before each run (a key's minute 90% used)."""
    more: list[int] = field(default_factory=list)
    """Its other processes, where it runs several (each in its own process group)."""
    metrics: str = ""
    """Where its Prometheus metrics are read, where it has them."""

    @property
    def pids(self) -> list[int]:
        """Every process it runs as (their descendants count with them)."""
        return [self.pid, *self.more]


def sse_events(tokens: int) -> list[str]:
    """A chat completion stream's events as llama-server sends them: one content chunk a token,
    the usage chunk with the engine's timings (which llmgw's router reads), [DONE]."""
    chunk = '{{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{}]{}}}'
    delta = '{{"index":0,"delta":{{"content":"w{} "}},"finish_reason":null}}'
    usage = f',"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},"total_tokens":{8 + tokens}}}'
    timings = (
        f',"timings":{{"cache_n":0,"prompt_n":8,"prompt_ms":2.4,"prompt_per_token_ms":0.3,'
        f'"prompt_per_second":3333.3,"predicted_n":{tokens},"predicted_ms":{10.0 * tokens},'
        '"predicted_per_token_ms":10.0,"predicted_per_second":100.0}'
    )
    last = chunk.format("", usage + timings)
    return [chunk.format(delta.format(i), "") for i in range(tokens)] + [last, "[DONE]"]


def _stream() -> str:
    """The stub's answer: 16 content chunks, the usage chunk and [DONE], as an SSE body."""
    return "".join(f"data: {event}\n\n" for event in sse_events(CHUNKS))


def ensure_debian(package: str, binary: str) -> str:
    """The path of `binary`, installing Debian's `package` when root (as ./dev does)."""
    if not shutil.which(binary) and shutil.which("apt-get") and os.geteuid() == 0:
        print(f"installing Debian's {package} for a benchmark", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", package], env=env, capture_output=True)
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if not found:
        raise Unavailable(f"{binary} is missing and could not be installed: apt-get install {package}")
    return found


def _venv_tool(name: str, requirement: str, tool: str) -> Path:
    """`tool` from `requirement`, installed once into its own environment under ~/.cache/llmgw/name."""
    env_dir = CACHE / name
    binary = env_dir / "bin" / tool
    if not binary.exists():
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        print(f"installing {requirement} into {env_dir} (once)", file=sys.stderr)
        env = {**os.environ, "VIRTUAL_ENV": str(env_dir)}
        for argv in (
            [uv, "venv", "-q", "--python", sys.executable, str(env_dir)],
            [uv, "pip", "install", "-q", requirement],
        ):
            done = subprocess.run(argv, env=env, capture_output=True)
            if done.returncode:
                raise Unavailable(f"{requirement} did not install: {done.stderr.decode().strip()[-200:]}")
    return binary


def start_group(stack: contextlib.ExitStack, argv: list[str], core: int | None, log: Path, **kw) -> subprocess.Popen:
    """`argv` pinned to `core` (None: not pinned) in its own process group, stopped (the whole
    group) when `stack` closes."""
    pin = core is not None and shutil.which("taskset") and (os.cpu_count() or 1) > 1
    prefix = ["taskset", "-c", str(core)] if pin else []
    with log.open("ab") as out:
        proc = subprocess.Popen(prefix + argv, stdout=out, stderr=out, start_new_session=True, **kw)

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    stack.callback(stop)
    return proc


def wait_ok(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180.0, headers: dict | None = None) -> None:
    """Until `url` answers 200; Unavailable with the end of the log if the process dies or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"exited {proc.returncode}: {log.read_text(errors='replace').strip()[-300:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1, headers=headers).status_code == 200:
                return
        time.sleep(0.3)
    raise Unavailable(f"{url} did not answer in {timeout:.0f}s: {log.read_text(errors='replace').strip()[-300:]}")


def tree(peer: Peer) -> list[psutil.Process]:
    """A peer's processes and their descendants (nginx's workers, a launcher's child)."""
    out = []
    for pid in peer.pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            out += [top, *top.children(recursive=True)]
    return out


def cpu_seconds(peer: Peer) -> float:
    """User and system CPU of a peer's processes."""
    total = 0.0
    for p in tree(peer):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(p.cpu_times()[:2])
    return total


def rss(peer: Peer) -> int:
    """Resident bytes of a peer's processes."""
    total = 0
    for p in tree(peer):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def settle(peer: Peer, most_s: float = 30.0) -> float:
    """Wait until a peer's processes use under 5% of a core over half a second (a gateway still
    working off the backlog of the last run, LiteLLM's after 64 connections, would otherwise
    weigh on the next row's); the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < most_s:
        before = cpu_seconds(peer)
        time.sleep(0.5)
        if cpu_seconds(peer) - before < 0.025:
            break
    return time.monotonic() - started


# -- nginx: the stub backend (static answer) and the plain reverse proxy --------------------------
def _nginx(
    stack: contextlib.ExitStack, tmp: Path, location: str, core: int, http: str = ""
) -> tuple[subprocess.Popen, int]:
    """One nginx worker on `core` serving `location` (with `http` beside the server block)."""
    nginx = ensure_debian("nginx", "nginx")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    temp = " ".join(f"{k}_temp_path {tmp}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp / "nginx.conf").write_text(
        f"worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log stderr error;\n"
        "events { worker_connections 4096; }\n"
        f"http {{ access_log off; {temp} {http}\n"
        f"  server {{ listen 127.0.0.1:{port}; keepalive_requests 1000000; location / {{ {location} }} }} }}\n"
    )
    log = tmp / "nginx.log"
    proc = start_group(stack, [nginx, "-e", "stderr", "-p", str(tmp), "-c", str(tmp / "nginx.conf")], core, log)
    wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=20)
    return proc, port


def start_backend(stack: contextlib.ExitStack, tmp: Path) -> Peer:
    """The stub backend every row goes to: nginx answering any request with the same chat stream,
    on the load generator's core (fast enough that no gateway is held back by it)."""
    body = _stream().replace("\n", "\\n")
    location = f"default_type text/event-stream; return 200 '{body}';"
    proc, port = _nginx(stack, tmp / "backend", location, LOAD_CORE)
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid)


def start_nginx(stack: contextlib.ExitStack, tmp: Path, backend: str) -> Peer:
    """nginx as a plain reverse proxy, buffering off, keep-alive to the backend: the floor."""
    location = 'proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off;'
    upstream = f"upstream b {{ server {backend.removeprefix('http://')}; keepalive 256; }}"
    proc, port = _nginx(stack, tmp / "nginx", location, GATEWAY_CORE, http=upstream)
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid)


def start_python_floor(stack: contextlib.ExitStack, tmp: Path, backend: str) -> Peer:
    """The least a gateway in Python costs (`python_floor.py`: uvloop and httptools, as the
    router; a request read and sent on, its answer relayed in chunks, nothing else)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), tmp / "python-floor.log"
    argv = [sys.executable, str(Path(__file__).with_name("python_floor.py")), str(port), backend]
    proc = start_group(stack, argv, GATEWAY_CORE, log)
    wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=20)
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid)


# -- vllm-router (Rust) ---------------------------------------------------------------------------
def start_vllm_router(
    stack: contextlib.ExitStack,
    tmp: Path,
    backend: str | list[str],
    policy: str = "round_robin",
    core: int | str | None = GATEWAY_CORE,
    more: Sequence[str] = (),
) -> Peer:
    """vllm-router with `policy` over the backends (round-robin over one, for the gateway bench;
    `cache_aware` over engines, for the routing bench) on `core` ("0,1": both, its threads one a
    core), `more` flags after those; installed under ~/.cache/llmgw/vllm-router."""
    binary = _venv_tool("vllm-router", VLLM_ROUTER, "vllm-router")
    port, metrics = free_port(), free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "vllm-router.log"
    workers = [backend] if isinstance(backend, str) else backend
    argv = [str(binary), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    argv += ["--policy", policy, "--log-level", "error", "--prometheus-port", str(metrics), *more]
    proc = start_group(stack, argv, core, log)
    wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=60)
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid, metrics=f"http://127.0.0.1:{metrics}/metrics")


# -- sglang's router (Rust) -----------------------------------------------------------------------
def start_sglang_router(stack: contextlib.ExitStack, tmp: Path, workers: list[str], more: Sequence[str] = ()) -> Peer:
    """sglang's router (`sglang-router launch`) with its cache-aware policy over the workers, at the
    settings its docs start from (cache threshold 0.3, balance 64 / 1.5), `more` flags after those;
    installed under ~/.cache/llmgw/sglang-router. Workers that are not sglang's (llama-server) are
    routed on an approximate prefix tree of the request's text: no tokenizer is needed. It adds
    its workers in the background after it starts: this waits until its pool holds them all."""
    binary = _venv_tool("sglang-router", SGLANG_ROUTER, "sglang-router")
    port, metrics = free_port(), free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "sglang-router.log"
    argv = [str(binary), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    argv += ["--policy", "cache_aware", "--cache-threshold", "0.3", "--balance-abs-threshold", "64"]
    argv += ["--balance-rel-threshold", "1.5", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    proc = start_group(stack, [*argv, "--log-level", "warn", *more], None, log)
    wait_ok(proc, f"http://127.0.0.1:{port}/health", log, timeout=120)
    url = f"http://127.0.0.1:{metrics}/metrics"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            pool = re.search(r"^smg_worker_pool_size(?:\{[^}]*\})? (\S+)", httpx.get(url, timeout=2).text, re.M)
            if pool and float(pool.group(1)) >= len(workers):
                return Peer(f"http://127.0.0.1:{port}", "k", proc.pid, metrics=url)
        time.sleep(0.5)
    raise Unavailable(f"its pool never held the {len(workers)} workers: {log.read_text(errors='replace')[-300:]}")


# -- Portkey's gateway (Node) --------------------------------------------------------------------
PORTKEY = ("@portkey-ai/gateway", "1.15.2")
PORTKEY_STACK = {"@hono/node-server": "1.13.5", "@hono/node-ws": "1.2.0", "hono": "4.9.7"}
"""Portkey's HTTP stack at the versions its own package-lock.json pins for 1.15.2 (what its Docker
image runs). The npm package ships no lockfile, and its `^1.3.3` now resolves @hono/node-server to
1.19.x, whose lightweight Response built from a fetched one keeps that response's immutable
headers: Portkey's `updateHeaders` then throws `TypeError: immutable` and every request answers
500 (Portkey-AI/gateway#1389: any @hono/node-server above 1.14.2)."""


def _npm_versions(home: Path, names: list[str]) -> dict[str, str | None]:
    """The version of each package installed under `home` (None: not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        manifest = home / "node_modules" / name / "package.json"
        found[name] = json.loads(manifest.read_text()).get("version") if manifest.exists() else None
    return found


def _install_portkey(npm: str, home: Path) -> Path:
    """Portkey's package with its HTTP stack pinned (npm `overrides`), installed once under `home`
    (again if what is there differs); the package's directory."""
    name, version = PORTKEY
    wanted = {name: version, **PORTKEY_STACK}
    if _npm_versions(home, list(wanted)) != wanted:
        print(f"installing {name}@{version} into {home} (once)", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)  # afresh: over an old tree npm left a pinned one out
        home.mkdir(parents=True)
        manifest = {"private": True, "dependencies": {name: version}, "overrides": PORTKEY_STACK}
        (home / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
        argv = [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund"]
        done = subprocess.run(argv, capture_output=True, timeout=600)
        if done.returncode:
            raise Unavailable(f"{name}@{version} did not install: {done.stderr.decode().strip()[-200:]}")
        got = _npm_versions(home, list(wanted))
        if got != wanted:
            raise Unavailable(f"{name}@{version} installed with {got}, not {wanted}")
    return home / "node_modules" / name


PORTKEY_FIRST_EVENT_WAIT = "await new Promise((e=>setTimeout(e,25)))"
"""Portkey's 25 ms wait before a stream's first event (`readStream`, src/handlers/streamHandler.ts
at 1.15.2), as it appears, once, in its published build/start-server.js: no setting turns it off."""


def _portkey_without_wait(script: Path) -> Path:
    """A copy of Portkey's built server beside it (the same node_modules and public/) with only
    its first-event wait taken out."""
    text = script.read_text()
    if text.count(PORTKEY_FIRST_EVENT_WAIT) != 1:
        raise Unavailable(f"{script} no longer holds Portkey's first-event wait exactly once")
    patched, new = script.with_name("start-server.nowait.js"), text.replace(PORTKEY_FIRST_EVENT_WAIT, "void 0")
    if not patched.exists() or patched.read_text() != new:
        patched.write_text(new)
    return patched


def start_portkey(stack: contextlib.ExitStack, tmp: Path, backend: str, wait: bool = True) -> Peer:
    """Portkey's open-source gateway on Node (its code unchanged, its HTTP stack at the versions
    its lockfile pins: `PORTKEY_STACK`), installed once with npm under ~/.cache/llmgw/portkey,
    started as deployed (`NODE_ENV=production`, headless) and forwarding to the backend as an
    OpenAI-compatible custom host (the headers its docs give for a local model). Note: Portkey
    waits 25 ms before relaying a stream's first event (streamHandler.ts), whatever the provider;
    `wait=False` runs a copy without that wait (`_portkey_without_wait`): Portkey at its best."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):
        raise Unavailable("no node and npm on PATH (Debian's nodejs and npm)")
    package = _install_portkey(npm, CACHE / "portkey")
    entry = json.loads((package / "package.json").read_text()).get("bin", {})
    script = package / (entry if isinstance(entry, str) else next(iter(entry.values()), "build/start-server.js"))
    if not wait:
        script = _portkey_without_wait(script)
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "portkey.log"
    env = {**os.environ, "NODE_ENV": "production"}  # as deployed: no request log console, no UI
    proc = start_group(stack, [node, str(script), f"--port={port}", "--headless"], GATEWAY_CORE, log, env=env)
    wait_ok(proc, f"http://127.0.0.1:{port}/", log, timeout=60)
    headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{backend}/v1"}
    return Peer(f"http://127.0.0.1:{port}", "k", proc.pid, headers)


# -- LiteLLM's proxy ------------------------------------------------------------------------------
MASTER_KEY = "sk-bench-" + "0" * 32
"""LiteLLM refuses to start without a master key; requests use it (no database: no virtual keys)."""


def start_litellm(stack: contextlib.ExitStack, tmp: Path, backend: str) -> Peer:
    """LiteLLM's proxy as its production page says: one worker, no database, no spend or error
        logs, logging at ERROR, the bundled cost map (offline); installed as its image is (`LITELLM`)
    under ~/.cache/llmgw/litellm-image."""
    binary = _venv_tool("litellm-image", LITELLM, "litellm")
    config = tmp / "litellm.yaml"
    config.write_text(
        f"model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
        f"      api_base: {backend}/v1\n      api_key: k\n"
        "litellm_settings:\n  set_verbose: false\n  json_logs: true\n  request_timeout: 600\n"
        "general_settings:\n  disable_spend_logs: true\n  disable_error_logs: true\n"
    )
    port = free_port()
    log = tmp / "litellm.log"
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    argv = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc = start_group(stack, argv, GATEWAY_CORE, log, env=env)
    wait_ok(proc, f"http://127.0.0.1:{port}/health/liveliness", log)
    return Peer(f"http://127.0.0.1:{port}", MASTER_KEY, proc.pid)


# -- llmgw's router -------------------------------------------------------------------------------
def _secured_nats(stack: contextlib.ExitStack, tmp: Path) -> tuple[str, dict[str, str]]:
    """A nats-server as a cluster runs it: nkeys with each role's permissions and TLS (a CA and a
    certificate made with openssl, as docs/security.md does). Its tls:// URL, and the files that
    sign in as the router and as the bench (the operator, unrestricted to write the buckets)."""
    from llmgw.bus import TlsFiles, new_identity, server_config, write_identity

    tls = tmp / "tls"
    tls.mkdir(parents=True)
    ssl = ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    quiet = {"check": True, "capture_output": True}
    subprocess.run([*ssl, "-x509", "-days", "2", "-subj", "/CN=bench CA", "-keyout", tls / "ca-key.pem"]
                   + ["-out", tls / "ca.pem"], **quiet)  # fmt: skip
    subprocess.run([*ssl, "-subj", "/CN=nats", "-keyout", tls / "key.pem", "-out", tls / "req.csr"], **quiet)
    subprocess.run(
        ["openssl", "x509", "-req", "-in", tls / "req.csr", "-CA", tls / "ca.pem", "-CAkey", tls / "ca-key.pem"]
        + ["-CAcreateserial", "-days", "2", "-out", tls / "cert.pem", "-extfile", "/dev/stdin"],
        input=b"subjectAltName=IP:127.0.0.1\n",
        **quiet,
    )
    router, bench = new_identity("router"), new_identity("ctl")
    write_identity(tmp / "router.nk", router)
    write_identity(tmp / "bench.nk", bench)
    port = free_port()
    files = TlsFiles(cert=str(tls / "cert.pem"), key=str(tls / "key.pem"), ca=str(tls / "ca.pem"))
    conf = tmp / "server.conf"
    conf.write_text(server_config([router], tmp / "js", port=port, tls=files, unrestricted=(bench.public,)))
    nats = start_nats_server(tmp / "nats", port=port, config=conf)
    stack.callback(nats.stop)
    return f"tls://127.0.0.1:{port}", {"router": str(tmp / "router.nk"), "bench": str(tmp / "bench.nk"), "ca": files.ca}


def start_router(
    stack: contextlib.ExitStack,
    tmp: Path,
    backends: str | list[str] | dict[str, str],
    limits=None,
    secure: bool = False,
    policy=None,
    env: dict[str, str] | None = None,
    used: float = 0.0,
    processes: int = 1,
    core: int | str | None = GATEWAY_CORE,
) -> Peer:
    """llmgw's router as its own process on its own NATS, a replica of model "m" on each backend
    (a dict: of each model named, on its backend); the key has `limits` (a `Limits`; None: none).
    `secure`: NATS with nkeys and TLS. `policy`: a guardrail policy (`guard.Policy`) its requests
    meet. `env`: more environment (OpenTelemetry's, say). `used`: the part of the key's
    tokens_per_minute its counters say is used this minute, set again before each run (as another
    router's writes would). `processes`: that many routers on `core` (a list such as "0,1" gives
    them several), each accepting on its own socket bound to the one port (SO_REUSEPORT: the
    kernel spreads the connections), handed over as `llmgw up` hands its own (`--listen-fd`)."""
    import msgspec

    from llmgw.bus import call, connect, kv_bucket
    from llmgw.proto import BUCKETS, CatalogRecord, KeyCreate, Model, Profile, ReplicaState
    from llmgw.proto import guard as guard_api
    from llmgw.proto import router as router_api

    tmp.mkdir(parents=True, exist_ok=True)
    if secure:
        url, creds = _secured_nats(stack, tmp)
        signin = ["--creds", creds["router"], "--tls-ca", creds["ca"]]
    else:
        nats = start_nats_server(tmp / "nats")
        stack.callback(nats.stop)
        url, creds, signin = nats.url, {"bench": "", "ca": ""}, []
    port = free_port()
    procs = []
    for i in range(processes):
        argv = [sys.executable, "-m", "llmgw.router.service", "--nats-url", url, *signin, "--http-port", str(port)]
        argv += ["--admin-port", "0", "--log-level", "warning", "--data-dir", str(tmp / f"router{i or ''}")]
        extra: dict = {"env": {**os.environ, **env}} if env else {}
        if processes > 1:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(1024)
            argv += ["--listen-fd", str(sock.fileno())]
            extra["pass_fds"] = (sock.fileno(),)
        log = tmp / f"router{i or ''}.log"
        procs.append(start_group(stack, argv, core, log, **extra))
    proc, log = procs[0], tmp / "router.log"

    async def setup() -> str:
        nc = await connect(url, "bench", creds=creds["bench"], tls_ca=creds["ca"])
        js = nc.jetstream()
        if isinstance(backends, dict):
            served = list(backends.items())
        else:
            served = [("m", b) for b in ([backends] if isinstance(backends, str) else backends)]
        catalog, replicas = await kv_bucket(js, BUCKETS["catalog"], 5), await kv_bucket(js, BUCKETS["replicas"])
        for name in dict.fromkeys(name for name, _ in served):
            model = Model(name=name, source=f"o/r/{name}.gguf", context=8192, profiles=[Profile(name="cpu", slots=2)])
            await catalog.put(name, msgspec.json.encode(CatalogRecord(model=model)))
        for i, (name, backend) in enumerate(served):
            replica = ReplicaState(id=f"r{i}", model=name, profile="cpu", node="n", state="ready", url=backend)
            await replicas.put(replica.id, msgspec.json.encode(replica))
        try:
            for _ in range(100):
                with contextlib.suppress(Exception):
                    create = KeyCreate(name="bench", **({"limits": limits} if limits else {}))
                    key = (await call(nc, router_api.KEY_CREATE, create)).key
                    if policy is not None:
                        await call(nc, guard_api.GUARD_PUT, policy)
                    return key
                await asyncio.sleep(0.2)
            raise Unavailable(f"the router made no key: {log.read_text(errors='replace').strip()[-300:]}")
        finally:
            await nc.close()

    key = asyncio.run(setup())
    wait_ok(proc, f"http://127.0.0.1:{port}/v1/models", log, headers={"authorization": f"Bearer {key}"})
    prepare = None
    if used and limits is not None and limits.tokens_per_minute:
        tokens = int(used * limits.tokens_per_minute)

        def prepare() -> None:
            asyncio.run(_spend(url, creds, key, tokens))

        prepare()
    return Peer(f"http://127.0.0.1:{port}", key, proc.pid, prepare=prepare, more=[p.pid for p in procs[1:]])


async def _spend(url: str, creds: dict[str, str], key: str, tokens: int) -> None:
    """Write the key's limit counters as `tokens` used this minute (its other windows kept), in
    the format `llmgw.router.accounts.counters` reads: what the router finds at its next write."""
    import hashlib

    import msgspec
    from nats.js.errors import KeyNotFoundError

    from llmgw.bus import connect, kv_bucket
    from llmgw.proto import BUCKETS
    from llmgw.router.accounts.limits import windows

    nc = await connect(url, "bench", creds=creds["bench"], tls_ca=creds["ca"])
    try:
        kv = await kv_bucket(nc.jetstream(), BUCKETS["limits"])
        sid = "key." + hashlib.sha256(key.encode()).hexdigest()[:16]
        minute = windows(time.time())["minute"][0]
        try:
            value = msgspec.json.decode((await kv.get(sid)).value)
        except KeyNotFoundError:
            value = {}
        await kv.put(sid, msgspec.json.encode({**value, "m": [minute, 0, tokens]}))
    finally:
        await nc.close()
