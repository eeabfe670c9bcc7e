"""A replica three ways: what the scheduler wants (spec), what its agent reports (report),
and both merged (state: the replicas bucket, what the router and `ctl` read)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta, Struct, field

from llmgw.proto._types import Name, NonNegative, ReplicaStatus

__all__ = ["ReplicaReport", "ReplicaSpec", "ReplicaState", "ReplicaTotals", "Worker", "replica_totals"]


# gc=False: plain data, never part of a reference cycle (see GpuInfo in llmgw.proto.node)
class Worker(Struct, kw_only=True, gc=False):
    """One more node a multi-node replica spans: a worker there holds part of the layers and
    the engine on the replica's own node drives it."""

    node: Name
    memory_mb: NonNegative = 0
    """Host memory claimed on that node."""
    cores: NonNegative = 0
    gpus: list[str] = field(default_factory=list)
    """UUIDs of the cards it holds there."""
    endpoint: str = ""
    """host:port the worker listens on, once its agent started it."""


class ReplicaSpec(Struct, kw_only=True):
    """What the scheduler wants of a replica: where it runs and what it holds there. Sent to the
    agent in ReplicaStart; the agent never changes it."""

    id: Name
    model: Name
    profile: Name
    node: Name
    memory_mb: NonNegative = 0
    """Host memory claimed on the node."""
    cores: NonNegative = 0
    """CPU cores it reserves (its profile's), 0: none reserved."""
    gpus: list[str] = field(default_factory=list)
    """UUIDs of the cards it holds, chosen by the scheduler."""
    workers: list[Worker] = field(default_factory=list)
    """The other nodes of a multi-node replica (its profile's `nodes` less this one)."""
    failures: NonNegative = 0
    """Failed starts of this model before this replica."""
    fingerprint: str = ""
    """The profile's fingerprint it was started with; another one now means it is stale."""
    estimate_mb: NonNegative = 0
    """Memory the scheduler reckoned one replica takes, MiB, all its cards together on cards
    (weights, KV cache for the context and slots, compute buffers, margin); 0: not reckoned."""
    tokens_per_s: Annotated[float, Meta(ge=0)] = 0.0
    """Tokens a second one reply gets this way on its node, as the scheduler reckoned it when it
    placed the replica (modelplan, calibrated where the node is); 0: not reckoned."""
    adapters: list[Name] = field(default_factory=list)
    """The model's LoRA adapters its engine loads, in the engine's order (llama.cpp's ids)."""


class ReplicaReport(Struct, kw_only=True):
    """What an agent says of a replica it runs: on `evt.replica.<id>`, in heartbeats and in its
    answers to start and stop. Identity and status only: no key, nothing the scheduler decided."""

    id: Name
    model: Name
    profile: Name
    node: Name
    state: ReplicaStatus = "pending"
    url: str = ""
    """Base URL of the engine once it listens (http://host:port)."""
    kv_events: str = ""
    """Where its engine publishes its KV events (tcp://host:port), with a profile's kv_events."""
    error: str = ""
    """Why it failed."""
    log_tail: list[str] = field(default_factory=list)
    """Last lines the engine printed, when it failed."""
    measured_mb: NonNegative = 0
    """Memory its engine uses now, MiB, as measured by its agent: the engine process's resident
    set (RSS) on the host plus what NVML says the process holds on its cards; 0: not measured
    (no engine running yet)."""
    updated: float = 0.0
    """Unix time of this report."""


# gc=False: plain data, never part of a reference cycle (see GpuInfo in llmgw.proto.node)
class ReplicaState(Struct, kw_only=True, gc=False):
    """Where a replica is and how it is doing: its spec and its latest report merged (the
    replicas bucket; `merge` in the scheduler's core builds it)."""

    id: Name
    model: Name
    profile: Name
    node: Name
    state: ReplicaStatus = "pending"
    url: str = ""
    """Base URL of the engine once it listens (http://host:port)."""
    memory_mb: NonNegative = 0
    """Host memory claimed on the node."""
    cores: NonNegative = 0
    """CPU cores it reserves (its profile's), 0: none reserved."""
    gpus: list[str] = field(default_factory=list)
    """UUIDs of the cards it holds, chosen by the scheduler."""
    workers: list[Worker] = field(default_factory=list)
    """The other nodes of a multi-node replica (its profile's `nodes` less this one)."""
    kv_events: str = ""
    """Where its engine publishes its KV events (tcp://host:port), with a profile's kv_events."""
    failures: NonNegative = 0
    """Failed starts of this model before this replica."""
    fingerprint: str = ""
    """The profile's fingerprint it was started with; another one now means it is stale."""
    estimate_mb: NonNegative = 0
    """Memory the scheduler reckoned it takes, MiB (`ReplicaSpec.estimate_mb`)."""
    tokens_per_s: Annotated[float, Meta(ge=0)] = 0.0
    """Tokens a second one reply gets this way on its node, as the scheduler reckoned it when it
    placed the replica (modelplan, calibrated where the node is); 0: not reckoned."""
    error: str = ""
    """Why it failed."""
    log_tail: list[str] = field(default_factory=list)
    """Last lines the engine printed, when it failed."""
    measured_mb: NonNegative = 0
    """Memory its engine uses now, MiB, as its agent measured it (`ReplicaReport.measured_mb`)."""
    adapters: list[Name] = field(default_factory=list)
    """The LoRA adapters its engine loads, in order (`ReplicaSpec.adapters`)."""
    updated: float = 0.0
    """Unix time of this state."""


@dataclass
class ReplicaTotals:
    """One model's replicas summed, as `llmgw ctl models` and the console's models page show them
    (a reading of `ReplicaState`s, not a message: it never travels)."""

    ready: int = 0
    """Replicas ready."""
    estimate_mb: int = 0
    """The most memory the scheduler reckoned one takes, MiB; 0: none reckoned."""
    measured_mb: int = 0
    """The most memory a ready one's engine uses, as its agent measured it, MiB; 0: none."""
    tokens_per_s: float = 0.0
    """Tokens a second one reply gets on the slowest replica, as reckoned; 0: none reckoned."""


def replica_totals(replicas: Iterable[ReplicaState]) -> dict[str, ReplicaTotals]:
    """Model name -> its replicas summed (`ReplicaTotals`)."""
    out: dict[str, ReplicaTotals] = {}
    for r in replicas:
        t = out.setdefault(r.model, ReplicaTotals())
        t.ready += r.state == "ready"
        t.estimate_mb = max(t.estimate_mb, r.estimate_mb)
        t.measured_mb = max(t.measured_mb, r.measured_mb if r.state == "ready" else 0)
        if r.tokens_per_s:
            t.tokens_per_s = min(t.tokens_per_s or r.tokens_per_s, r.tokens_per_s)
    return out
