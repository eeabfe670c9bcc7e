"""The catalog's contract: models, their profiles and scaling, changes, and its endpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._page import Page
from llmgw.proto._types import Name, NonNegative, Positive, Source
from llmgw.proto.mirror import FilePlace

__all__ = [
    "ENDPOINTS",
    "EVENTS",
    "LEAST_CONTEXT",
    "MODEL_CHANGE",
    "MODEL_CHANGED",
    "MODEL_GET",
    "MODEL_LIST",
    "MODEL_PURGE",
    "MODEL_PUT",
    "MODEL_REMOVE",
    "MOST_REVISION",
    "SERVE",
    "SERVE_PLAN",
    "CatalogRecord",
    "ChangeSpec",
    "Model",
    "ModelChange",
    "ModelEntry",
    "ModelList",
    "ModelPurge",
    "ModelPut",
    "ModelRef",
    "Profile",
    "PurgeReport",
    "RestartModel",
    "ScaleModel",
    "Scaling",
    "ScheduleWindow",
    "ServeModel",
    "ServePlan",
    "ServePlanAsk",
    "ServeWay",
    "SetAliases",
    "SetClass",
    "SetContext",
    "SetGpus",
    "SetOwner",
    "SetReplicas",
    "StartModel",
    "StopModel",
]


LEAST_CONTEXT = 128
"""The shortest context a model in the catalog may have, in tokens."""
MOST_REVISION = 2**63 - 1
"""The largest KV revision a caller may name (compare-and-set): the largest int64."""


class ScheduleWindow(Struct, kw_only=True):
    """A scaling that holds during part of the day (UTC, "HH:MM")."""

    start: Annotated[str, Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    end: Annotated[str, Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    min: NonNegative
    max: NonNegative


class Scaling(Struct, kw_only=True):
    """How many replicas of a model run."""

    min: NonNegative = 1
    """Replicas kept running at all times."""
    max: NonNegative = 1
    """Most replicas run at once."""
    idle_timeout_s: NonNegative | None = None
    """On-demand: scale to zero after this long without requests."""
    schedule: list[ScheduleWindow] = field(default_factory=list)
    """Scalings by time of day; outside every window min/max hold."""


class Profile(Struct, kw_only=True, frozen=True):  # frozen as its model is
    """One way to run a model."""

    name: Name = "cpu"
    """The profile's name, unique within its model."""
    engine: Literal["llamacpp", "vllm"] = "llamacpp"
    """Engine that serves it."""
    args: list[str] = field(default_factory=list)
    """Extra engine arguments."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the engine."""
    host_memory_mb: NonNegative | None = None
    """Host memory the replica reserves, MiB; None: estimated from the weights."""
    cpu_cores: Positive | None = None
    """CPU cores (engine threads) it reserves; None: half the node's."""
    slots: Positive = 2
    """Requests the engine serves at once (llama-server -np)."""
    startup_timeout_s: Positive = 120
    """Seconds the engine has to become healthy before the replica fails."""
    gpus: NonNegative = 0
    """GPUs per replica on one node; 0 is a CPU profile."""
    priority: int = 0
    """Higher is tried first; the highest profile that fits wins."""
    replicas: NonNegative | None = None
    """Replicas that run on this profile; None: the model's scaling decides where."""
    tensor_parallel: Positive = 1
    """Cards one replica's layers are split across (must divide gpus)."""
    nodes: Positive = 1
    """Nodes one replica spans (llama.cpp: the engine on the first, an RPC worker on each other,
    the layers split between them); each node gives `gpus` cards, or on the CPU its share of
    the memory. For a model no one node can hold."""
    keep_within: Annotated[str, Meta(pattern=r"^([a-z][a-z0-9_.-]*)?$")] = ""
    """A label (rack, row, room, site) that all of a multi-node replica's nodes share the value
    of: for a fabric whose links do not reach across racks. Nodes without it are passed over.
    Empty: no constraint."""
    gpu_class: str = ""
    """Card class it needs ("h100-80g"); empty: any card with the memory."""
    min_card_mb: NonNegative = 0
    """Memory every card must have at least, MiB: in place of naming a class, every class that
    meets it will do, so one catalog entry places sensibly on any site's cards."""
    min_compute: Annotated[str, Meta(pattern=r"^([0-9]+\.[0-9]+)?$")] = ""
    """Least compute capability of its cards ("8.9" for FP8 kernels); empty: any."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Labels a node must have."""
    weight: Positive = 1
    """Router weight among replicas of one pool."""
    kv_events: bool = False
    """vLLM only: the engine publishes what its prefix cache holds (KV events over ZMQ) and the
    router sends each request to the replica holding most of its prompt's leading blocks. It
    costs a round trip per request (the router asks a replica to tokenize the prompt first), and
    pays where long shared prefixes meet many replicas; it also lets the router refuse a
    prompt longer than the context before any engine runs it."""


# Frozen, and its lists and dicts (profiles, a profile's args, env and node_selector) are never
# changed in place either: a change is a new record (`msgspec.structs.replace`), so what is worked
# out from one (the scheduler's fingerprints of its profiles) is remembered for the object.
class Model(Struct, kw_only=True, frozen=True, weakref=True):
    """A model in the catalog."""

    name: Name
    """What clients ask for in `model`."""
    source: Source
    """Weights file as the mirror holds it."""
    context: Annotated[int, Meta(ge=LEAST_CONTEXT)] = 4096
    """Context length in tokens, shared by the slots."""
    profiles: Annotated[list[Profile], Meta(min_length=1)] = field(default_factory=lambda: [Profile()])
    """Ways to run it."""
    scaling: Scaling = field(default_factory=Scaling)
    """How many replicas run."""
    stopped: Scaling | None = None
    """Set while the model is stopped: the scaling it had, which start brings back."""
    aliases: list[Name] = field(default_factory=list)
    """Other names clients may ask for."""
    fallbacks: list[Name] = field(default_factory=list)
    """Models that answer, in order, when this one cannot."""
    max_output: Positive | None = None
    """Longest answer in tokens."""
    capacity_class: Literal["critical", "standard", "batch"] = "standard"
    """A higher class may take room from a lower one."""
    owner: str = ""
    """Team or person responsible."""
    generation: NonNegative = 0
    """Raised by restart: every replica of an older generation is started again, one at a time."""
    rollout: Literal["surge", "in-place"] = "surge"
    """How stale replicas are replaced: surge starts the new one beside the old, in-place stops the
    old one first (for when there is no room beside it). Set by the change that made them stale."""


class CatalogRecord(Struct, kw_only=True):
    """What the catalog bucket keeps under a model's name (everyone else only reads it)."""

    model: Model
    changed_by: str = ""
    """Who made the last change."""
    changed_at: float = 0.0
    """Unix time of the last change."""
    declared_in: str = ""
    """The YAML file that declares this model; changes go there, not through the API."""


class ModelEntry(Struct, kw_only=True):
    """A model with its KV revision (for compare-and-set) and who changed it last."""

    model: Model
    revision: int
    """KV revision; pass it back on put to change exactly this version."""
    changed_by: str = ""
    """Who made the last change."""
    declared_in: str = ""
    """The YAML file that declares it, if any (then change it there)."""
    warnings: list[str] = field(default_factory=list)
    """What the catalog warned of as it took this change (a slow way, a context past the
    model's training); empty on reads."""


class ModelPut(Struct, kw_only=True):
    """Create or change a model."""

    model: Model
    revision: int | None = None
    """Expected current revision: 0 means it must not exist yet, None means the latest."""
    by: str = ""
    """Who is making the change (recorded)."""


class ModelRef(Struct, kw_only=True):
    """A model by name."""

    name: Name
    revision: int | None = None
    """On remove: the revision it must be at (compare-and-set, else 409); None: any. Get ignores it."""


class ModelPurge(Struct, kw_only=True):
    """Remove a model and delete its files from the mirror and the nodes once its replicas stopped."""

    name: Name
    by: str = ""
    """Who is removing it (recorded in the log)."""
    revision: int | None = None
    """The revision it must be at (compare-and-set, else 409 and nothing removed); None: any."""


class PurgeReport(Struct, kw_only=True):
    """What a purge removed and deleted, and what it kept."""

    entry: ModelEntry
    """The model as it was before removal."""
    deleted: list[FilePlace] = field(default_factory=list)
    kept: list[FilePlace] = field(default_factory=list)


class ChangeSpec(Struct, kw_only=True):
    """What every change to a model says: which model, who asks, and the revision it expects.

    Each kind of change is a subclass tagged by `action` that carries only its own fields; on
    the wire a change is one flat object (`{"action": "scale", "name": "m", ..., "scaling": ...}`).
    This base is never sent alone: `ModelChange` is the union of the kinds.
    """

    name: Name
    """The model to change."""
    by: str = ""
    """Who is making the change (recorded)."""
    revision: int | None = None
    """Expected current revision; None: the latest."""


class StopModel(ChangeSpec, kw_only=True, tag_field="action", tag="stop"):
    """Stop every replica; the scaling (and counts) are kept for start."""


class StartModel(ChangeSpec, kw_only=True, tag_field="action", tag="start"):
    """Bring a stopped model back exactly as it was."""


class RestartModel(ChangeSpec, kw_only=True, tag_field="action", tag="restart"):
    """Start every replica again, one at a time."""

    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class ScaleModel(ChangeSpec, kw_only=True, tag_field="action", tag="scale"):
    """A new scaling (a stopped model starts with it)."""

    scaling: Scaling


class SetReplicas(ChangeSpec, kw_only=True, tag_field="action", tag="replicas"):
    """Replicas per profile; the scaling becomes their sum."""

    counts: dict[str, NonNegative] = field(default_factory=dict)
    """Profile name -> replicas; profiles not named keep theirs."""
    cpu_memory_mb: Positive | None = None
    """Add a CPU profile 'cpu' reserving this much host memory."""
    cpu_cores: Positive | None = None
    """The cores that CPU profile reserves."""


class SetContext(ChangeSpec, kw_only=True, tag_field="action", tag="context"):
    """A new context length and/or longest answer."""

    context: Annotated[int, Meta(ge=LEAST_CONTEXT)] | None = None
    """The new context length (its replicas restart)."""
    max_output: Positive | None = None
    """The new longest answer (applied at once)."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class SetGpus(ChangeSpec, kw_only=True, tag_field="action", tag="gpus"):
    """GPUs per replica of the profiles named."""

    gpus: dict[str, NonNegative] = field(default_factory=dict)
    """Profile name -> GPUs per replica."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class SetClass(ChangeSpec, kw_only=True, tag_field="action", tag="class"):
    """The capacity class: a higher class may take room from a lower one."""

    capacity_class: Literal["critical", "standard", "batch"]


class SetOwner(ChangeSpec, kw_only=True, tag_field="action", tag="owner"):
    """The team or person responsible."""

    owner: str = ""
    """Empty: nobody."""


class SetAliases(ChangeSpec, kw_only=True, tag_field="action", tag="alias"):
    """Aliases added and dropped."""

    add_aliases: list[Name] = field(default_factory=list)
    """Names to add."""
    remove_aliases: list[Name] = field(default_factory=list)
    """Names to drop."""


ModelChange = Annotated[
    StopModel
    | StartModel
    | RestartModel
    | ScaleModel
    | SetReplicas
    | SetContext
    | SetGpus
    | SetClass
    | SetOwner
    | SetAliases,
    Meta(title="ModelChange"),
]
"""An operator's change to one model, by name, recorded with who made it: one of the kinds above,
told apart by `action`. Its title is the name docs/subjects.md and a 400's message give it."""


class ModelList(Struct, kw_only=True):
    """Every model in the catalog (or a page of them, by name)."""

    models: list[ModelEntry]
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


class ServePlanAsk(Struct, kw_only=True):
    """Every way a mirrored file can run on the fleet as it is now."""

    source: Source
    """The file as the mirror holds it ('OWNER/REPO@COMMIT/FILE')."""
    context: NonNegative = 0
    """Context in tokens, shared by the slots; 0: the model's trained context, at most 8192
    (4096 when the file does not say)."""
    cores: NonNegative = 0
    """Threads a CPU replica gets; 0: half a node's cores."""
    slots: Positive = 2
    """Requests one replica serves at once (llama-server -np)."""


class ServeWay(Struct, kw_only=True):
    """One way to run the file: where, the memory it needs, where it fits, how fast it answers."""

    kind: Literal["cpu", "gpu", "multi-gpu", "across-nodes"]
    cards: NonNegative = 0
    """Cards one replica takes (0 on the CPU)."""
    card_class: str = ""
    """Their class ("h100-80g"); empty on the CPU."""
    threads: NonNegative = 0
    """CPU threads (on the CPU; on each node, across nodes)."""
    nodes: Positive = 1
    """Nodes one replica spans (across nodes: its layers split, llama.cpp's RPC workers on all but one)."""
    memory_mb: NonNegative = 0
    """Memory one replica needs: host RAM on the CPU (on each node, across nodes), per card on cards."""
    weights_mb: NonNegative = 0
    kv_mb: NonNegative = 0
    """The KV cache for the context and slots."""
    buffers_mb: NonNegative = 0
    """Compute buffers and a margin."""
    node: str = ""
    """The node its speed was reckoned on (the fastest where it fits now, if any)."""
    nodes_fit: list[str] = field(default_factory=list)
    """Nodes where it fits now."""
    more_replicas: NonNegative = 0
    """Replicas of it that fit now, over those nodes."""
    tokens_per_s: float = 0.0
    """About how many tokens a second one reply gets; 0: unknown (no measured memory rate)."""
    mark: Literal["", "slow", "very slow"] = ""
    """Slow: under 15 tokens a second; very slow: under 5."""
    reply_500_s: float = 0.0
    """Seconds a reply of 500 tokens takes at that speed (0: unknown)."""
    on_purpose: bool = False
    """Serving this way alone takes `cpu_anyway` (the CPU chosen on purpose): a CPU way under 5
    tokens a second, or the CPU while cards that fit are free. The catalog refuses it without."""
    calibrated: bool = False
    """The speed comes from the node's own calibration (`llmgw plan calibrate`), not the defaults."""


class ServePlan(Struct, kw_only=True):
    """The ways a file can run on the fleet, best first."""

    source: str
    context: NonNegative
    """The context the ways were sized for."""
    trained_context: NonNegative = 0
    """What the model was trained for (0: the file does not say)."""
    slots: Positive = 2
    ways: list[ServeWay] = field(default_factory=list)
    """Best first: fits now, then fastest, then fewest cards."""
    warnings: list[str] = field(default_factory=list)


class ServeModel(Struct, kw_only=True):
    """Put a mirrored file into service the way asked (or the plan's best): a model in the catalog."""

    source: Source
    name: Annotated[str, Meta(pattern=r"^([A-Za-z0-9][A-Za-z0-9_-]{0,62})?$")] = ""
    """The model's name; empty: from the file's name."""
    cpu: bool = False
    """A profile on the CPU (below the cards' when `gpus` is given too)."""
    gpus: NonNegative = 0
    """A profile on this many cards a replica."""
    cores: NonNegative = 0
    """Threads of the CPU profile; 0: half a node's."""
    context: NonNegative = 0
    """As the plan takes it."""
    slots: Positive = 2
    replicas: dict[str, NonNegative] | str = field(default_factory=dict)
    """Replicas per profile ('gpu', 'cpu'), as a map or as 'gpu=7,cpu=4'; empty: one replica,
    on the best profile that fits."""
    cpu_anyway: bool = False
    """The CPU is chosen on purpose: taken even when very slow, or while cards that fit are free."""
    by: str = ""
    """Who is serving it (recorded)."""


MODEL_PUT = Endpoint(
    "catalog", "model.put", ModelPut, ModelEntry, "Create or replace a model (compare-and-set on `revision`)."
)
MODEL_GET = Endpoint(
    "catalog",
    "model.get",
    ModelRef,
    ModelEntry,
    "One model with its revision.",
    admin=AdminRoute("GET", "/models/{name}"),
)
MODEL_LIST = Endpoint(
    "catalog",
    "model.list",
    Page,
    ModelList,
    "Every model in the catalog, in pages by name.",
    admin=AdminRoute("GET", "/models"),
)
MODEL_REMOVE = Endpoint("catalog", "model.remove", ModelRef, ModelEntry, "Remove a model (its files stay).")
MODEL_CHANGE = Endpoint(
    "catalog", "model.change", ModelChange, ModelEntry, "Stop, start, restart, scale, resize one model."
)
MODEL_PURGE = Endpoint(
    "catalog",
    "model.purge",
    ModelPurge,
    PurgeReport,
    "Remove a model and delete the files no other model uses.",
    timeout_s=150.0,  # its replicas stopped first, then files deleted on the mirror and every node
)
_PLAN_S = 60.0
"""A plan reads the file's header from the mirror and asks the scheduler for its nodes."""
SERVE_PLAN = Endpoint(
    "catalog",
    "serve.plan",
    ServePlanAsk,
    ServePlan,
    "Every way a mirrored file can run on the fleet now, best first: memory, nodes, tokens a second, slow marks.",
    timeout_s=_PLAN_S,
    admin=AdminRoute("GET", "/serve/plan"),
)
SERVE = Endpoint(
    "catalog",
    "serve.model",
    ServeModel,
    ModelEntry,
    "Put a mirrored file into service: the way chosen becomes its profiles (a very slow CPU way needs cpu_anyway).",
    timeout_s=_PLAN_S,
    admin=AdminRoute("POST", "/serve", 201),
)
ENDPOINTS = (MODEL_PUT, MODEL_GET, MODEL_LIST, MODEL_REMOVE, MODEL_CHANGE, MODEL_PURGE, SERVE_PLAN, SERVE)
"""The catalog's endpoints."""

MODEL_CHANGED = Event(
    "model", CatalogRecord, "A model was put or changed (the stored record; empty when removed).", ("name",), "catalog"
)
EVENTS = (MODEL_CHANGED,)
"""What the catalog publishes."""
