"""The agent's rules, without I/O: the cards and port a replica gets, the command lines of its
engine and workers (a profile's args and env kept to llmgw.modelplan's allow-list and this node's
opt-in), which cached weights may go, and what never leaves the node (the engine's key)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import msgspec

from llmgw.modelplan import check_engine_args, choose_cards, cpu_threads
from llmgw.proto import FilePlace, GpuInfo, Model, Profile, WeightsDeleted

__all__ = [
    "Deletion",
    "EngineSetup",
    "Launch",
    "adapter_sources",
    "cards_for",
    "check_profile",
    "collect",
    "delete",
    "launch",
    "parse_ports",
    "pick_port",
    "redact",
    "what_it_said",
    "worker_launch",
]

VLLM_MEMORY_UTILISATION = 0.9
HIDDEN = "***"
"""What a secret reads as in logs, reports and events."""


class Launch(msgspec.Struct, kw_only=True):
    """How a child process is started: its arguments and the environment it gets besides the agent's."""

    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class EngineSetup:
    """What an engine of one replica is started with."""

    binary: str
    """The engine's program (llama-server, or vLLM's command)."""
    weights: Path
    """The model file in this node's cache."""
    port: int
    adapters: dict[str, Path] = field(default_factory=dict)
    """Its LoRA adapters by name, in the order the engine loads them (their files in the cache)."""
    model: Model
    profile: Profile
    api_key: str
    """The key the engine demands (never logged: see `redact`)."""
    node_cpus: int
    """Logical CPUs of this node (the profile's threads are a share of them)."""
    cards: list[GpuInfo] = field(default_factory=list)
    host: str = "127.0.0.1"
    """Where it listens (the node's address on the cluster network)."""
    kv_events_port: int = 0
    """vLLM: where it publishes its KV events; 0: none."""
    rpc: list[str] = field(default_factory=list)
    """Across nodes: the workers' host:port."""
    layers: int = 0
    """Across nodes on the CPU: the model's layer count (this node keeps its share)."""
    allowed: frozenset[str] = frozenset()
    """Engine flags and variables this node opted into besides the allow-list (`engine_args_allowed`)."""


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


def adapter_sources(model: Model, names: Sequence[str]) -> list[str]:
    """The files of `model`'s adapters `names` (a replica's, in its order); ValueError naming
    one the model does not have (the model changed between placing and starting it)."""
    sources = {a.name: a.source for a in model.adapters}
    missing = [n for n in names if n not in sources]
    if missing:
        raise ValueError(f"model '{model.name}' has no adapter {', '.join(missing)} (it changed since it was placed)")
    return [sources[n] for n in names]


def cards_for(profile: Profile, chosen: list[str], here: list[GpuInfo], taken: set[str]) -> list[GpuInfo]:
    """The cards `chosen` by the scheduler if all are here and free, else free ones for `profile`
    (`llmgw.modelplan.choose_cards`). A ValueError says what is missing."""
    if not chosen:
        return choose_cards(profile, here, taken)
    cards = [g for g in here if g.uuid in chosen and g.uuid not in taken]
    if len(cards) != len(chosen):
        free = ", ".join(g.uuid for g in here if g.uuid not in taken) or "none"
        raise ValueError(f"the cards {', '.join(chosen)} are not all here and free (free here: {free})")
    return cards


def check_profile(profile: Profile, allowed: Collection[str] = ()) -> None:
    """Raise a ValueError saying what of the profile's args and env this node refuses to give its
    engine (`llmgw.modelplan.check_engine_args`, with the flags and variables `allowed` besides)."""
    refused = check_engine_args(profile.engine, profile.args, profile.env, allowed)
    if refused:
        raise ValueError("; ".join(refused))


def _cards_env(profile: Profile, cards: list[GpuInfo]) -> dict[str, str]:
    env = dict(profile.env)
    if cards:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in cards)
    return env


def launch(setup: EngineSetup) -> Launch:
    """The engine's command line and environment for one replica, listening on `setup.host`.

    llama-server: always explicit -c, -np and -ngl; on cards, every layer there and split by the
    cards' memory, but for the experts of the profile's `cpu_moe_layers` first layers (in host
    memory). Across nodes (`rpc`: the workers' host:port), the layers go to the workers as
    well: on cards every layer is offloaded and split by free memory; on the CPU this node keeps
    its share of the `layers` and the rest go to the workers. vLLM: tensor parallel over its
    cards, a memory pool, the context as the longest sequence, and (with a KV events port)
    events over ZMQ with a fixed PYTHONHASHSEED and portable block hashes, so the router can
    match prefixes. A profile's args (after the agent's own) and env keep to `check_profile`.
    """
    check_profile(setup.profile, setup.allowed)
    env = _cards_env(setup.profile, setup.cards)
    vllm = setup.profile.engine == "vllm"
    argv = _vllm(setup, env) if vllm else _llama_server(setup)
    # The key goes in the environment, never the command line: /proc/<pid>/environ is its owner's
    # alone, while anyone on the node reads a command line (ps).
    env["VLLM_API_KEY" if vllm else "LLAMA_API_KEY"] = setup.api_key
    return Launch(argv=[*argv, *setup.profile.args], env=env)


def _vllm(s: EngineSetup, env: dict[str, str]) -> list[str]:
    served = s.weights if s.weights.suffix == ".gguf" else s.weights.parent
    argv = [s.binary, "serve", str(served), "--host", s.host, "--port", str(s.port)]
    argv += ["--served-model-name", s.model.name, "--tensor-parallel-size", str(s.profile.tensor_parallel)]
    argv += ["--pipeline-parallel-size", str(max(len(s.cards) // s.profile.tensor_parallel, 1))]
    argv += ["--gpu-memory-utilization", str(VLLM_MEMORY_UTILISATION), "--max-model-len", str(s.model.context)]
    argv += ["--max-num-seqs", str(s.profile.slots)]
    if s.model.kind == "embedding":  # /v1/embeddings, pooled as the model's own config says
        return [*argv, "--runner", "pooling", "--convert", "embed"]
    if s.kv_events_port:
        env["PYTHONHASHSEED"] = "0"
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://{s.host}:{s.kv_events_port}"}
        argv += ["--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor"]
        argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
    return argv


def _llama_server(s: EngineSetup) -> list[str]:
    offload = "999" if s.cards else "0"
    if s.rpc and not s.cards:
        offload = str(max(s.layers - s.layers // (len(s.rpc) + 1), 1))
    argv = [s.binary, "--model", str(s.weights), "--host", s.host, "--port", str(s.port)]
    # llama-server cuts its context among its slots; an embedding model (no KV cache to speak of)
    # gets its whole context in each, so every slot embeds an input as long as the model reads
    context = s.model.context * (s.profile.slots if s.model.kind == "embedding" else 1)
    argv += ["-c", str(context), "-np", str(s.profile.slots), "-ngl", offload]
    argv += ["--threads", str(cpu_threads(s.profile.cpu_cores, s.node_cpus))]
    argv += ["--alias", s.model.name]
    if s.model.kind == "embedding":  # /v1/embeddings, pooled as its header says; chats are refused (501)
        argv += ["--embedding"]
    if s.cards and s.profile.cpu_moe_layers:  # the first N layers' experts in host memory
        argv += ["--n-cpu-moe", str(s.profile.cpu_moe_layers)]
    if s.adapters:  # loaded, none applied: each request says which (the router's `lora` field)
        argv += ["--lora-init-without-apply"]
        for path in s.adapters.values():
            argv += ["--lora", str(path)]
    if s.rpc:
        argv += ["--rpc", ",".join(s.rpc)]
    elif len(s.cards) > 1:
        argv += ["--split-mode", "layer", "--tensor-split", ",".join(str(g.memory_total_mb) for g in s.cards)]
    return argv


def worker_launch(  # noqa: PLR0913 (the worker's program, where it listens, and for whom: each its own)
    binary: str,
    host: str,
    port: int,
    profile: Profile,
    node_cpus: int,
    cards: list[GpuInfo],
    allowed: Collection[str] = (),
) -> Launch:
    """llama.cpp's RPC worker for this node's part of a replica across nodes: it serves its cards
    (or its CPU with the profile's threads) to the engine on the replica's node, which sends it
    its layers. It has no authentication: `host` must be on a private network. It gets the
    profile's env, kept to `check_profile` (`allowed`: this node's opt-in)."""
    check_profile(profile, allowed)
    argv = [binary, "--host", host, "--port", str(port), "--threads", str(cpu_threads(profile.cpu_cores, node_cpus))]
    return Launch(argv=argv, env=_cards_env(profile, cards))


_TELLING = re.compile(r"error|fail|cannot|unable|invalid|abort|out of memory|not enough|too large", re.I)


def what_it_said(error: str, tail: Sequence[str], log: str = "") -> str:
    """Why a child failed, with the last lines it printed that tell why (those naming an error,
    else its last two) and where its whole log stays (`log`, where one is kept)."""
    lines = [line.strip()[:240] for line in tail if line.strip()]
    telling = [line for line in lines if _TELLING.search(line)] or lines
    said = f"; it printed: {' | '.join(telling[-2:])}" if telling else ""
    return f"{error}{said}{f' (its whole log: {log})' if log else ''}"


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret in it (an engine's key) hidden."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    return text


class Deletion(NamedTuple):
    """Which cached folders go, and the answer that says what went and what stayed (and why)."""

    folders: list[Path]
    answer: WeightsDeleted


Running = Mapping[str, Collection[str]]
"""Replica id -> the sources it runs on (its weights and adapters)."""


def _users(sources: list[str], running: Running) -> list[str]:
    """The replicas (of `running`) using one of `sources`."""
    return sorted(rid for rid, used in running.items() if any(s in sources for s in used))


def delete(entries: Mapping[Path, list[str]], asked: list[str], running: Running, where: str) -> Deletion:
    """The cached contents (`entries`: folder -> the sources that are it) to delete for the
    `asked` sources: those no replica here runs on (`running`) and that are no other source too;
    the rest kept, saying why."""
    out = Deletion([], WeightsDeleted(where=where))
    for folder, sources in entries.items():
        mine = [s for s in sources if s in asked]
        if not mine:
            continue
        users, others = _users(sources, running), [s for s in sources if s not in asked]
        if users or others:
            why = f"replica {', '.join(users)} runs on it" if users else f"the same file is also {', '.join(others)}"
            out.answer.kept.extend(FilePlace(source=s, where=where, why=why) for s in mine)
            continue
        out.folders.append(folder)
        out.answer.deleted.extend(mine)
    return out


def collect(entries: Mapping[Path, list[str]], keep: list[str], running: Running, where: str) -> Deletion:
    """Every cached content no model uses (none of its sources in `keep`) and no replica here runs on."""
    out = Deletion([], WeightsDeleted(where=where))
    for folder, sources in entries.items():
        if any(s in keep for s in sources) or _users(sources, running):
            continue
        out.folders.append(folder)
        out.answer.deleted.extend(sources or [folder.name])
    return out
