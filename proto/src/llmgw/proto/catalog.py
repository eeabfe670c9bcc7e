"""The catalog's contract: models, their profiles and scaling, changes, and its endpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._change import (
    MOST_ADAPTERS,
    Adapter,
    ChangeSpec,
    ModelChange,
    RestartModel,
    ScaleModel,
    SetAdapters,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
    adapter_name,
)
from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._page import Page
from llmgw.proto._scaling import LEAST_CONTEXT, Scaling, ScheduleWindow
from llmgw.proto._serve import ServeModel, ServePlan, ServePlanAsk, ServeWay
from llmgw.proto._types import Name, NonNegative, Positive, Source
from llmgw.proto.hub import HubSearch, HubWays
from llmgw.proto.mirror import FileInfo, FilePlace

__all__ = [
    "ENDPOINTS",
    "HUB_SEARCH",
    "LEAST_CONTEXT",
    "MODEL_CHANGE",
    "MODEL_GET",
    "MODEL_LIST",
    "MODEL_PURGE",
    "MODEL_PUT",
    "MODEL_REMOVE",
    "MOST_ADAPTERS",
    "MOST_REVISION",
    "SERVE",
    "SERVE_PLAN",
    "Adapter",
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
    "SetAdapters",
    "SetAliases",
    "SetClass",
    "SetContext",
    "SetGpus",
    "SetOwner",
    "SetReplicas",
    "SetResources",
    "StartModel",
    "StopModel",
    "adapter_name",
]


MOST_REVISION = 2**63 - 1
"""The largest KV revision a caller may name (compare-and-set): the largest int64."""


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
    cpu_moe_layers: NonNegative = 0
    """llama.cpp on cards, a model of experts: the routed experts of its first N layers stay in
    host memory and run on the CPU (`--n-cpu-moe N`), the rest on the cards. For a model of
    experts whose weights do not fit its cards but whose dense part does; the serve plan works
    out the fewest layers. Placement reserves those experts' memory on the node (host_memory_mb,
    where given, overrides). 0: every layer on the cards."""
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
    judge: bool = False
    """Served as a guardrail judge (guardrail policies' `judge` checks ask it)."""
    kind: Literal["chat", "embedding"] = "chat"
    """embedding: its engine answers /v1/embeddings only (llama-server --embedding, pooling as
    the file's header says); `serve` sets it from the header."""
    generation: NonNegative = 0
    """Raised by restart: every replica of an older generation is started again, one at a time."""
    adapters: Annotated[list[Adapter], Meta(max_length=MOST_ADAPTERS)] = field(default_factory=list)
    """LoRA adapters its llama.cpp replicas load beside the weights (GGUF LoRA files): clients ask
    for `MODEL:ADAPTER`, and each request applies its own adapter alone."""
    rollout: Literal["surge", "in-place"] = "surge"
    """How stale replicas are replaced: surge starts the new one beside the old, in-place stops the
    old one first (for when there is no room beside it). Set by the change that made them stale."""

    def files(self) -> list[str]:
        """Every file its replicas run on: its weights, then its adapters'."""
        return [self.source, *(a.source for a in self.adapters)]


class CatalogRecord(Struct, kw_only=True):
    """What the catalog bucket keeps under a model's name (everyone else only reads it)."""

    model: Model
    changed_by: str = ""
    """Who made the last change."""
    changed_at: float = 0.0
    """Unix time of the last change."""
    declared_in: str = ""
    """The YAML file that declares this model; changes go there, not through the API."""
    file: FileInfo | None = None
    """Its file as the mirror answered for it when it was put or served (size, hash and what its
    header says): the scheduler places it with these facts, not asking again. None: not known."""
    trace: str = ""
    """The W3C traceparent of the change that wrote it, where that change was traced: the
    scheduler's replicas started for it join that trace (ctl -> catalog -> scheduler -> agent)."""


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
    file: FileInfo | None = None
    """Its file as the mirror answered for it (`CatalogRecord.file`)."""


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
    by: str = ""
    """On remove: who removes it (the audit trail says)."""


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


class ModelList(Struct, kw_only=True):
    """Every model in the catalog (or a page of them, by name)."""

    models: list[ModelEntry]
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


MODEL_PUT = Endpoint(
    "catalog", "model.put", ModelPut, ModelEntry, "Create or replace a model (compare-and-set on `revision`)."
)
MODEL_GET = Endpoint(
    "catalog",
    "model.get",
    ModelRef,
    ModelEntry,
    "One model with its revision.",
    admin=AdminRoute("GET", "/models/{name}", least="operator"),
)
MODEL_LIST = Endpoint(
    "catalog",
    "model.list",
    Page,
    ModelList,
    "Every model in the catalog, in pages by name.",
    admin=AdminRoute("GET", "/models", least="operator"),
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
_HUB_S = 90.0
"""A search asks the Hub, then reads a header of every file found (in parallel)."""
SERVE_PLAN = Endpoint(
    "catalog",
    "serve.plan",
    ServePlanAsk,
    ServePlan,
    "Every way a mirrored file can run on the fleet now, best first: memory, nodes, tokens a second, slow marks.",
    timeout_s=_PLAN_S,
    admin=AdminRoute("GET", "/serve/plan", least="operator"),
)
SERVE = Endpoint(
    "catalog",
    "serve.model",
    ServeModel,
    ModelEntry,
    "Put a mirrored file into service: the way chosen becomes its profiles (a very slow CPU way needs cpu_anyway).",
    timeout_s=_PLAN_S,
    admin=AdminRoute("POST", "/serve", 201, least="operator"),
)
HUB_SEARCH = Endpoint(
    "catalog",
    "hub.search",
    HubSearch,
    HubWays,
    "Models on the Hub with their GGUF files (headers read by range) and the ways each would run here now.",
    timeout_s=_HUB_S,
    admin=AdminRoute("GET", "/hub/search", least="operator"),
)
ENDPOINTS = (MODEL_PUT, MODEL_GET, MODEL_LIST, MODEL_REMOVE, MODEL_CHANGE, MODEL_PURGE, SERVE_PLAN, SERVE, HUB_SEARCH)
"""The catalog's endpoints."""
