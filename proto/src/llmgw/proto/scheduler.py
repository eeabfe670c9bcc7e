"""The scheduler's contract: the inventory, replicas and model statuses it answers for."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._page import Page
from llmgw.proto._types import Empty, Name, NonNegative
from llmgw.proto.node import NodeInfo
from llmgw.proto.replica import ReplicaState

__all__ = [
    "ENDPOINTS",
    "MODEL_ROOM",
    "MODEL_STATUS",
    "NODE_LIST",
    "NODE_REGISTER",
    "REPLICA_LIST",
    "ModelRoom",
    "ModelStatus",
    "ModelStatusList",
    "NodeHealth",
    "NodeList",
    "ProfileRoom",
    "ReplicaList",
    "RoomAsk",
]


class NodeHealth(Struct, kw_only=True):
    """How a node stands, judged by the scheduler's own rule (its core's `health`)."""

    state: Literal["ready", "suspect", "lost"]
    """suspect: silent longer than `stale_s` (it gets no new replicas); lost: longer than
    `lost_s` (its replicas are replaced)."""
    silent_s: float = 0.0
    """Seconds since its last heartbeat, less the time the scheduler could not hear at all
    (away from NATS, or hearing no node)."""


class NodeList(Struct, kw_only=True):
    """Every node the scheduler knows, as last reported, and how each stands."""

    nodes: list[NodeInfo]
    health: dict[str, NodeHealth] = field(default_factory=dict)
    """Node -> how it stands now, as the scheduler judges it."""
    stale_s: float
    """The scheduler's `stale_s`: a node silent longer is suspect (it gets no new replicas)."""
    lost_s: float
    """The scheduler's `lost_s`: a node silent longer is lost (its replicas are replaced)."""
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


class ModelStatus(Struct, kw_only=True):
    """How a model is doing, as the scheduler sees it."""

    model: Name
    state: Literal["running", "starting", "parked", "held", "backing-off", "stopped", "idle"]
    """parked: it cannot be placed (reason says why, node by node); held: it gave room to a
    higher capacity class and waits for room, not re-placed in a loop; backing-off: its
    replicas kept failing and the next try waits until `until`; idle: an on-demand model
    scaled to zero, started by its next request."""
    ready: NonNegative = 0
    wanted: NonNegative = 0
    reason: str = ""
    until: float = 0.0
    """Unix time of the next try, while backing off."""


class ModelStatusList(Struct, kw_only=True):
    """Every model's status (or a page of them, by model)."""

    models: list[ModelStatus]
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


class RoomAsk(Struct, kw_only=True):
    """Which model's room to reckon."""

    name: Name


class ProfileRoom(Struct, kw_only=True):
    """How many more replicas of one profile would be placed now."""

    profile: Name
    more_now: NonNegative = 0
    """Replicas more that fit the fleet's free room now (counted up to `most`)."""
    more_preempting: NonNegative = 0
    """And with the room of every lower capacity class's replicas taken: at most what preemption
    frees (the scheduler stops lower replicas for one of these only where one replica's room is
    enough, so a replica that needs the room of two is counted here and may not be placed)."""
    most: NonNegative = 0
    """Counting stopped here: "at least this many"."""
    why: str = ""
    """Where none fits now: what each node lacks, as a parked model's reason says it."""


class ModelRoom(Struct, kw_only=True):
    """How many more replicas of each of a model's profiles would be placed now."""

    model: Name
    profiles: list[ProfileRoom] = field(default_factory=list)


class ReplicaList(Struct, kw_only=True):
    """Replicas the scheduler keeps (or a page of them, by model and id)."""

    replicas: list[ReplicaState]
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


NODE_REGISTER = Endpoint(
    "scheduler",
    "node.register",
    NodeInfo,
    Empty,
    "A node's agent introduces itself (only on its own node's subject, naming that node).",
    speaks_for="node",
)
_MEMORY_S = 3.0
"""The scheduler answers these from memory: a page drawn without them sooner rather than later."""
REPLICA_LIST = Endpoint(
    "scheduler",
    "replica.list",
    Page,
    ReplicaList,
    "Every replica and its state, in pages.",
    timeout_s=_MEMORY_S,
    admin=AdminRoute("GET", "/fleet/replicas", least="operator"),
)
NODE_LIST = Endpoint(
    "scheduler",
    "node.list",
    Page,
    NodeList,
    "Every node as last reported (cards, memory, read rates, calibration), in pages.",
    timeout_s=_MEMORY_S,
    admin=AdminRoute("GET", "/fleet/nodes", least="operator"),
)
MODEL_STATUS = Endpoint(
    "scheduler",
    "model.status",
    Page,
    ModelStatusList,
    "How each model is doing (ready and wanted replicas, why not placed), in pages.",
    timeout_s=_MEMORY_S,
    admin=AdminRoute("GET", "/fleet/models", least="operator"),
)
MODEL_ROOM = Endpoint(
    "scheduler",
    "model.room",
    RoomAsk,
    ModelRoom,
    "How many more replicas of each of a model's profiles fit now, and with lower classes' room taken.",
    timeout_s=_MEMORY_S,
    admin=AdminRoute("GET", "/fleet/models/{name}/room", least="operator"),
)
ENDPOINTS = (NODE_REGISTER, REPLICA_LIST, NODE_LIST, MODEL_STATUS, MODEL_ROOM)
"""The scheduler's endpoints."""
