"""What the pure core takes (the desired state, the actual one, the policy) and what it gives
back: a plan for the shell to carry out."""

from __future__ import annotations

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import Model, NodeInfo, Profile, ReplicaState
from llmgw.scheduler.placement import Weights

__all__ = ["Actual", "AgentStop", "Desired", "NodeView", "Plan", "Policy", "Start", "Stop"]


class NodeView(msgspec.Struct, kw_only=True):
    """A node as the inventory knows it."""

    info: NodeInfo
    last_seen: float
    """Unix time of its last heartbeat or registration."""
    deaf_s: float = 0.0
    """The scheduler's deaf time then (`Hearing.deaf_s`): its silence since counts without
    the time the scheduler could not hear it."""
    weights: list[str] = msgspec.field(default_factory=list)
    """Sources its cache holds (from its last heartbeat)."""


class Desired(msgspec.Struct, kw_only=True):
    """What is asked for: the catalog's models, and when the router last saw each asked for."""

    models: dict[str, Model] = msgspec.field(default_factory=dict)
    demand: dict[str, float] = msgspec.field(default_factory=dict)
    """Model name -> Unix time of its last request (on-demand models wake and idle by it)."""


class Actual(msgspec.Struct, kw_only=True):
    """What there is: the nodes, the replicas recorded, and the files the mirror holds."""

    nodes: dict[str, NodeView] = msgspec.field(default_factory=dict)
    replicas: list[ReplicaState] = msgspec.field(default_factory=list)
    """Recorded replicas, not being stopped: what a pass counts, keeps, stops and replaces."""
    stopping: list[ReplicaState] = msgspec.field(default_factory=list)
    """Replicas being stopped (draining, or asked to stop at once): their cards and cores are
    still theirs until their agents stopped them, so no pass gives that room out before."""
    weights: dict[str, int] = msgspec.field(default_factory=dict)
    """Source -> its size in bytes, for the files the mirror confirmed it holds."""
    shapes: dict[str, Shape] = msgspec.field(default_factory=dict)
    """Source -> its model's shape, for the GGUF files whose header was read: a replica's need is
    then modelplan's estimate for its context, not the file's size."""
    known_since: float = 0.0
    """When the inventory began listening: a node never heard of counts as lost `lost_s` after."""
    deaf_s: float = 0.0
    """The scheduler's deaf time now (`Hearing.deaf_s`): away from NATS, or hearing no node."""
    known_deaf_s: float = 0.0
    """Its deaf time at `known_since`."""


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """The knobs of a reconcile pass, each default in this one place (the scheduler's config
    takes its defaults from here and builds the policy from itself)."""

    stale_s: float = 10.0
    """A node with no heartbeat for this long (suspect) gets no new replicas."""
    lost_s: float = 30.0
    """A node with no heartbeat for this long is lost: its replicas are replaced elsewhere. Only
    the time the scheduler could hear counts (`Hearing`): not while it was away from NATS, nor
    while every node was silent for more than `stale_s`."""
    drain_s: float = 5.0
    """A ready replica being stopped gets this long for its in-flight requests (the router sends
    it nothing new meanwhile) before its engine is stopped."""
    reserve_mb: int = 512
    """Host memory left free on every node."""
    score_nodes: int = 100
    """At most this many nodes that fit are scored for each replica (the scan of a big fleet
    stops there, starting where the last one stopped); 0 scores every node."""
    scoring: Weights = Weights()
    """How much each placement scorer counts."""
    tries: int = 5
    """Tries of a pass at most where replicas are left unplaced: the first in the speed order,
    each next with the models the tries before left unplaced first; the try that starts the
    most replicas (then the most tokens a second) is the plan."""
    improve: int = 20_000
    """A try's starts are improved after its greedy pass (replicas moved, or trading places,
    where the predicted tokens a second rise), and moved off a node to make room for a replica
    left unplaced, where one sweep's checks, the starts times the starts and the nodes, are at
    most this many (0: never): small passes, not a big fleet's."""
    exact: int = 5_000
    """Where a try leaves replicas unplaced, they and its starts are placed exactly (an integer
    program, `exact`) where the ways they could go are at most this many (0: never)."""


# gc=False: never part of a reference cycle; a pass makes one per replica it starts
class Start(msgspec.Struct, kw_only=True, gc=False):
    """Start this replica (recorded pending: its spec and no report yet)."""

    replica: ReplicaState
    model: Model
    profile: Profile
    after: list[str] = msgspec.field(default_factory=list)
    """The replicas stopped in this plan on its nodes: it starts once they stopped (they free
    the room it may have been placed in)."""


class Stop(msgspec.Struct, kw_only=True):
    """Stop this recorded replica, for this reason; its record goes once it stopped."""

    replica: ReplicaState
    reason: str
    reachable: bool = True
    """False for a replica on a lost node: its record goes without asking its agent."""
    drain: bool = True
    """Give in-flight requests the drain grace first (a ready replica); False where its room
    is needed at once (an in-place replacement)."""
    grace_s: float = 0.0
    """How long its in-flight requests get before its engine is stopped: the policy's drain for
    a reachable ready replica that drains, else none."""


class AgentStop(msgspec.Struct, frozen=True, kw_only=True):
    """Ask a node's agent to stop a replica's engine (or, `worker`, its RPC worker there)
    without touching its record: one no longer recorded, or a record already changed."""

    node: str
    id: str
    reason: str
    worker: bool = False


class Plan(msgspec.Struct, kw_only=True):
    """What to do now, and why a model could not be placed."""

    starts: list[Start] = msgspec.field(default_factory=list)
    stops: list[Stop] = msgspec.field(default_factory=list)
    records: list[ReplicaState] = msgspec.field(default_factory=list)
    """Records to write as they are (an agent's report merged into its spec, a failure)."""
    forgets: list[ReplicaState] = msgspec.field(default_factory=list)
    """Records to drop without asking anyone: their agent no longer runs them."""
    asks: list[AgentStop] = msgspec.field(default_factory=list)
    unplaced: dict[str, str] = msgspec.field(default_factory=dict)
    """Model name -> why no node took it (each node's reason)."""
    backoff_until: dict[str, float] = msgspec.field(default_factory=dict)
    """Model name -> when its next try is, while it backs off."""
    held: dict[str, str] = msgspec.field(default_factory=dict)
    """Model name -> the higher-class model it gave a replica's room to in this pass."""

    def absorb(self, part: Plan) -> None:
        """Add another plan's actions and reasons to this one."""
        self.starts.extend(part.starts)
        self.stops.extend(part.stops)
        self.records.extend(part.records)
        self.forgets.extend(part.forgets)
        self.asks.extend(part.asks)
        self.unplaced.update(part.unplaced)
        self.backoff_until.update(part.backoff_until)
        self.held.update(part.held)
