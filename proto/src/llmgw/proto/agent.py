"""An agent's contract: its heartbeat, and the endpoints each node's agent answers."""

from __future__ import annotations

from msgspec import Struct, field

from llmgw.proto._endpoint import Endpoint, Event
from llmgw.proto._types import Empty, Name
from llmgw.proto.catalog import Model, Profile
from llmgw.proto.mirror import WeightsDelete, WeightsDeleted
from llmgw.proto.node import NodeInfo
from llmgw.proto.release import RELEASE_CHANGED, RELEASE_LIST, RELEASE_SET
from llmgw.proto.replica import ReplicaReport, ReplicaSpec, Worker

__all__ = [
    "ENDPOINTS",
    "EVENTS",
    "HEARTBEAT",
    "REPLICA_CHANGED",
    "REPLICA_START",
    "REPLICA_STOP",
    "WEIGHTS_COLLECT",
    "WEIGHTS_DELETE",
    "WORKER_START",
    "WORKER_STOP",
    "Heartbeat",
    "ReplicaStart",
    "ReplicaStop",
    "WeightsCollect",
    "WorkerStart",
]


class Heartbeat(Struct, kw_only=True):
    """An agent's periodic report."""

    info: NodeInfo
    replicas: list[ReplicaReport] = field(default_factory=list)
    load1: float = 0.0
    """One-minute load average."""
    sent: float = 0.0
    """Unix time it was sent."""
    weights: list[str] = field(default_factory=list)
    """Sources whose weights this node holds in its cache (placement prefers them)."""
    workers: list[str] = field(default_factory=list)
    """Replicas whose workers run here (parts of multi-node replicas led from other nodes)."""


class ReplicaStart(Struct, kw_only=True):
    """The scheduler's word to an agent: run this replica."""

    replica: ReplicaSpec
    model: Model
    profile: Profile


class WorkerStart(Struct, kw_only=True):
    """The scheduler's word to an agent: run this node's worker of a multi-node replica, and
    answer with where it listens once it does."""

    replica: ReplicaSpec
    model: Model
    profile: Profile


class ReplicaStop(Struct, kw_only=True):
    """The scheduler's word to an agent: stop this replica."""

    id: Name
    reason: str = ""


class WeightsCollect(Struct, kw_only=True):
    """Delete every cached file but these (the sources the catalog's models use)."""

    keep: list[str]


REPLICA_START = Endpoint(
    "agent",
    "replica.start",
    ReplicaStart,
    ReplicaReport,
    "Run a replica on this node.",
    per_node=True,
    signed_by="scheduler",
)
REPLICA_STOP = Endpoint(
    "agent",
    "replica.stop",
    ReplicaStop,
    ReplicaReport,
    "Stop a replica on this node.",
    per_node=True,
    signed_by="scheduler",
)
WORKER_START = Endpoint(
    "agent",
    "worker.start",
    WorkerStart,
    Worker,
    "Run this node's RPC worker of a multi-node replica.",
    per_node=True,
    signed_by="scheduler",
)
WORKER_STOP = Endpoint(
    "agent", "worker.stop", ReplicaStop, Empty, "Stop this node's RPC worker.", per_node=True, signed_by="scheduler"
)
WEIGHTS_DELETE = Endpoint(
    "agent",
    "weights.delete",
    WeightsDelete,
    WeightsDeleted,
    "Delete files from every node's cache.",
    every_instance=True,
)
WEIGHTS_COLLECT = Endpoint(
    "agent",
    "weights.collect",
    WeightsCollect,
    WeightsDeleted,
    "Delete every cached file no model uses.",
    every_instance=True,
)
ENDPOINTS = (
    REPLICA_START,
    REPLICA_STOP,
    WORKER_START,
    WORKER_STOP,
    WEIGHTS_DELETE,
    WEIGHTS_COLLECT,
    RELEASE_SET,
    RELEASE_LIST,
)
"""The endpoints every agent serves (the first four under its node's name, signed by the scheduler;
the releases': `release.py`)."""

HEARTBEAT = Event("node.heartbeat", Heartbeat, "A node's facts and its replicas' reports.", ("node",), "agent")
REPLICA_CHANGED = Event(
    "replica",
    ReplicaReport,
    "A replica's state changed on its node (only that node's agent may say so).",
    ("node", "id"),
    "agent",
)
EVENTS = (HEARTBEAT, REPLICA_CHANGED, RELEASE_CHANGED)
"""What agents publish."""
