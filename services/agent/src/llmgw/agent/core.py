"""The agent's rules, without I/O: which cards and port a replica gets, and the engine's command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import msgspec

from llmgw.modelplan import cpu_threads
from llmgw.proto import GpuInfo, Model, Profile, card_fits

__all__ = ["FOREIGN_LIMIT_MB", "Launch", "launch", "parse_ports", "pick_cards", "pick_port", "worker_launch"]

FOREIGN_LIMIT_MB = 1024
"""A card holding more than this for processes that are not ours is not free."""
VLLM_MEMORY_UTILISATION = 0.9


class Launch(msgspec.Struct, kw_only=True):
    """How an engine is started: its arguments and the environment it gets besides the agent's."""

    argv: list[str]
    env: dict[str, str]


def parse_ports(text: str) -> range:
    """'20000-20999' as a range; a ValueError says what to write instead."""
    first, dash, last = text.partition("-")
    try:
        lo, hi = int(first), int(last if dash else first)
    except ValueError:
        raise ValueError(f"ports '{text}' is not FIRST-LAST (for example 20000-20999)") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"ports '{text}': need 1024 <= FIRST <= LAST <= 65535")
    return range(lo, hi + 1)


def pick_port(ports: range, taken: set[int], bindable: Callable[[int], bool]) -> int:
    """The first port of the range no replica holds and nothing else listens on."""
    for port in ports:
        if port not in taken and bindable(port):
            return port
    raise ValueError(
        f"no free port in {ports.start}-{ports.stop - 1} ({len(taken)} held by replicas here); widen the agent's ports"
    )


def pick_cards(profile: Profile, gpus: list[GpuInfo], taken: set[str]) -> list[GpuInfo]:
    """The cards a replica of `profile` runs on: free ones of its class (any class, if it names none),
    all of one class. A ValueError says what the node lacks."""
    if profile.gpus == 0:
        return []
    free = [
        g
        for g in gpus
        if g.uuid not in taken and g.memory_foreign_mb < FOREIGN_LIMIT_MB and card_fits(profile, g) is None
    ]
    by_class: dict[str, list[GpuInfo]] = {}
    for g in free:
        by_class.setdefault(g.cls, []).append(g)
    for cards in by_class.values():
        if len(cards) >= profile.gpus:
            linked = sorted(cards, key=lambda g: -len(set(g.nvlink_peers) & {c.uuid for c in cards}))
            return sorted(linked[: profile.gpus], key=lambda g: (g.index, g.uuid))
    wanted = f"class {profile.gpu_class}" if profile.gpu_class else "one class"
    have = ", ".join(f"{len(c)} {k}" for k, c in sorted(by_class.items())) or "none"
    raise ValueError(
        f"profile '{profile.name}' needs {profile.gpus} free cards of {wanted}; this node has {have} free "
        f"of {len(gpus)} cards"
    )


def _tensor_split(cards: list[GpuInfo]) -> str:
    return ",".join(str(g.memory_total_mb) for g in cards)


def launch(
    engine_binary: str,
    weights: Path,
    port: int,
    model: Model,
    profile: Profile,
    api_key: str,
    node_cpus: int,
    cards: list[GpuInfo],
    kv_events_port: int = 0,
    host: str = "127.0.0.1",
    rpc: list[str] | None = None,
    layers: int = 0,
) -> Launch:
    """The engine's command line and environment for one replica, listening on `host`.

    llama-server: always explicit -c, -np and -ngl; on cards, every layer there and split by the
    cards' memory. Across nodes (`rpc`: the workers' host:port), the layers go to the workers as
    well: on cards every layer is offloaded and split by free memory; on the CPU this node keeps
    its share of the `layers` and the rest go to the workers. vLLM: tensor parallel over its
    cards, a memory pool, the context as the longest sequence, and (with a KV events port)
    events over ZMQ with a fixed PYTHONHASHSEED and portable block hashes, so the router can
    match prefixes.
    """
    env = dict(profile.env)
    if cards:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in cards)
    if profile.engine == "vllm":
        served = weights if weights.suffix == ".gguf" else weights.parent
        argv = [
            engine_binary,
            "serve",
            str(served),
            "--host",
            host,
            "--port",
            str(port),
            "--api-key",
            api_key,
            "--served-model-name",
            model.name,
            "--tensor-parallel-size",
            str(profile.tensor_parallel),
            "--pipeline-parallel-size",
            str(max(len(cards) // profile.tensor_parallel, 1)),
            "--gpu-memory-utilization",
            str(VLLM_MEMORY_UTILISATION),
            "--max-model-len",
            str(model.context),
            "--max-num-seqs",
            str(profile.slots),
        ]
        if kv_events_port:
            env["PYTHONHASHSEED"] = "0"
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://{host}:{kv_events_port}"}
            argv += [
                "--enable-prefix-caching",
                "--prefix-caching-hash-algo",
                "sha256_cbor",
                "--kv-events-config",
                json.dumps(events, separators=(",", ":")),
            ]
        return Launch(argv=[*argv, *profile.args], env=env)
    offload = "999" if cards else "0"
    if rpc and not cards:
        offload = str(max(layers - layers // (len(rpc) + 1), 1))
    argv = [
        engine_binary,
        "--model",
        str(weights),
        "--host",
        host,
        "--port",
        str(port),
        "-c",
        str(model.context),
        "-np",
        str(profile.slots),
        "-ngl",
        offload,
        "--threads",
        str(cpu_threads(profile.cpu_cores, node_cpus)),
        "--api-key",
        api_key,
        "--alias",
        model.name,
    ]
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    elif len(cards) > 1:
        argv += ["--split-mode", "layer", "--tensor-split", _tensor_split(cards)]
    return Launch(argv=[*argv, *profile.args], env=env)


def worker_launch(binary: str, host: str, port: int, profile: Profile, node_cpus: int, cards: list[GpuInfo]) -> Launch:
    """llama.cpp's RPC worker for this node's part of a replica across nodes: it serves its cards
    (or its CPU with the profile's threads) to the engine on the replica's node, which sends it
    its layers. It has no authentication: `host` must be on a private network."""
    env = dict(profile.env)
    if cards:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in cards)
    argv = [binary, "--host", host, "--port", str(port), "--threads", str(cpu_threads(profile.cpu_cores, node_cpus))]
    return Launch(argv=argv, env=env)
