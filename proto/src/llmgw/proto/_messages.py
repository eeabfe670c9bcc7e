"""The messages. Field docstrings are what the JSON Schema describes."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

__all__ = [
    "card_fits",
    "CatalogRecord",
    "ChangeSpec",
    "CpuCalibration",
    "Empty",
    "FileInfo",
    "FileList",
    "FileRef",
    "Filesystem",
    "GpuInfo",
    "Heartbeat",
    "KeyCreate",
    "KeyCreated",
    "KeyRecord",
    "Model",
    "ModelEntry",
    "ModelList",
    "ModelPut",
    "ModelChange",
    "ModelPurge",
    "ModelRef",
    "ModelStatus",
    "ModelStatusList",
    "Demand",
    "KeyList",
    "KeyRef",
    "Limits",
    "Project",
    "UsageQuery",
    "UsageRecord",
    "UsageReport",
    "UsageRow",
    "FilePlace",
    "NodeInfo",
    "NodeList",
    "PurgeReport",
    "Profile",
    "ReplicaList",
    "ReplicaStart",
    "ReplicaState",
    "ReplicaStop",
    "Scaling",
    "ScheduleWindow",
    "WeightsCollect",
    "WeightsDelete",
    "WeightsDeleted",
    "all_messages",
]

Name = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$",
        description="letters, digits, '-' and '_', at most 63, starting with a letter or digit",
    ),
]
"""A name safe in NATS subjects and KV keys (no dots: they split subjects)."""

Source = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)+$",
        description="'<owner>/<repo>/<file>' as the mirror holds it",
    ),
]

NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
ReplicaStatus = Literal["pending", "fetching", "starting", "ready", "draining", "failed", "stopped"]
"""A replica's life: placed (pending), weights fetched, engine starting, ready; draining while
it is being stopped (the router sends it nothing new), failed, stopped."""


class Empty(Struct, forbid_unknown_fields=False):
    """A request or reply with nothing in it."""


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


class Profile(Struct, kw_only=True):
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


def _capability(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")) if text else ()


def card_fits(profile: Profile, card: GpuInfo) -> str | None:
    """None if `card` is one `profile` may run on (its class, memory and compute capability), else
    what it lacks."""
    if profile.gpu_class and card.cls != profile.gpu_class:
        return f"class {card.cls}, not {profile.gpu_class}"
    if card.memory_total_mb < profile.min_card_mb:
        return f"{card.memory_total_mb} MiB, under {profile.min_card_mb}"
    if profile.min_compute and _capability(card.compute_capability) < _capability(profile.min_compute):
        return f"compute capability {card.compute_capability or 'unknown'}, under {profile.min_compute}"
    return None


class Model(Struct, kw_only=True):
    """A model in the catalog."""

    name: Name
    """What clients ask for in `model`."""
    source: Source
    """Weights file as the mirror holds it."""
    context: Annotated[int, Meta(ge=128)] = 4096
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


class ModelPurge(Struct, kw_only=True):
    """Remove a model and delete its files from the mirror and the nodes once its replicas stopped."""

    name: Name
    by: str = ""
    """Who is removing it (recorded in the log)."""


class FilePlace(Struct, kw_only=True):
    """A weights file in one place (the mirror or a node), and what became of it."""

    source: str
    where: str
    """'mirror' or the node's name."""
    why: str = ""
    """Why it was kept (another model uses it, a replica still runs on it), or empty."""


class PurgeReport(Struct, kw_only=True):
    """What a purge removed and deleted, and what it kept."""

    entry: ModelEntry
    """The model as it was before removal."""
    deleted: list[FilePlace] = field(default_factory=list)
    kept: list[FilePlace] = field(default_factory=list)


class WeightsDelete(Struct, kw_only=True):
    """Delete these files from a weights store (the mirror, or every node's cache)."""

    sources: list[Source]


class WeightsCollect(Struct, kw_only=True):
    """Delete every cached file but these (the sources the catalog's models use)."""

    keep: list[str]


class WeightsDeleted(Struct, kw_only=True):
    """One store's answer to WeightsDelete."""

    where: str
    """'mirror' or the node's name."""
    deleted: list[str] = field(default_factory=list)
    kept: list[FilePlace] = field(default_factory=list)


class ChangeSpec(Struct, kw_only=True):
    """What to change in a model; `action` says which fields below it reads."""

    action: Literal["stop", "start", "restart", "scale", "replicas", "context", "gpus", "class", "owner", "alias"]
    scaling: Scaling | None = None
    """For scale: the new scaling."""
    counts: dict[str, NonNegative] = field(default_factory=dict)
    """For replicas: profile name -> replicas; profiles not named keep theirs."""
    cpu_memory_mb: Positive | None = None
    """For replicas: add a CPU profile 'cpu' reserving this much host memory."""
    cpu_cores: Positive | None = None
    """For replicas: the cores that CPU profile reserves."""
    context: Annotated[int, Meta(ge=128)] | None = None
    """For context: the new context length."""
    max_output: Positive | None = None
    """For context: the new longest answer."""
    gpus: dict[str, NonNegative] = field(default_factory=dict)
    """For gpus: profile name -> GPUs per replica."""
    capacity_class: Literal["critical", "standard", "batch"] | None = None
    """For class."""
    owner: str | None = None
    """For owner."""
    add_aliases: list[Name] = field(default_factory=list)
    """For alias: names to add."""
    remove_aliases: list[Name] = field(default_factory=list)
    """For alias: names to drop."""
    in_place: bool = False
    """For restart, context and gpus: stop each replica before its replacement starts (no room beside it)."""
    revision: int | None = None
    """Expected current revision; None: the latest."""


class ModelChange(ChangeSpec, kw_only=True):
    """An operator's change to one model, by name, recorded with who made it."""

    name: Name
    by: str = ""


class ModelList(Struct, kw_only=True):
    """Every model in the catalog."""

    models: list[ModelEntry]


class CpuCalibration(Struct, kw_only=True):
    """How a node's threads read model weights: the constants of the CPU speed estimate.

    The defaults were fitted on another fleet (llama-bench against measured bandwidth);
    `llmgw plan calibrate` fits a node's own and the agent reports them.
    """

    core_share: float = 0.95
    """A thread reads this share of one core's measured rate ..."""
    thread_exp: float = 0.9
    """... times threads to this power (each added thread adds a little less)."""
    read_share: float = 0.68
    """Share of the whole machine's rate read, where one core's rate is not known."""
    token_fixed_s: float = 0.005
    """A token's cost that does not grow with the model, seconds."""
    f16_gflops_per_core: float = 12.0
    """Matrix work one thread does on F16/BF16 weights, GFLOP/s: their speed is capped by it."""
    source: str = "defaults fitted on another fleet"
    """Where the figures come from."""
    worst_error: float = 0.0
    """The fit's largest relative error over what it measured (0 for the defaults)."""


class GpuInfo(Struct, kw_only=True):
    """One card (or one MIG instance of a card) as NVML reports it."""

    index: NonNegative
    """The card's index (a MIG instance: its card's)."""
    uuid: str
    """GPU-... or, for a MIG instance, MIG-...; what CUDA_VISIBLE_DEVICES takes."""
    name: str
    cls: str
    """The class every service calls it by ("h100-80g", "a100-mig-3g.40gb")."""
    memory_total_mb: NonNegative
    memory_used_mb: NonNegative = 0
    memory_foreign_mb: NonNegative = 0
    """Used by processes that are not this agent's engines."""
    compute_capability: str = ""
    """"9.0" for an H100."""
    mig_parent: str = ""
    """For a MIG instance, the UUID of the card it is carved from."""
    nvlink_peers: list[str] = field(default_factory=list)
    """UUIDs of the cards it reaches over NVLink."""


class Filesystem(Struct, kw_only=True):
    """A filesystem the node keeps weights on."""

    path: str
    total_mb: NonNegative
    free_mb: NonNegative


class NodeInfo(Struct, kw_only=True):
    """What a node is: sent on registration and in every heartbeat."""

    node: Name
    """The node's id (the agent's name)."""
    hostname: str
    cpus: Positive
    """Logical CPUs."""
    memory_total_mb: NonNegative
    memory_available_mb: NonNegative
    engines: dict[str, str] = field(default_factory=dict)
    """Engines installed here ('llamacpp', 'vllm') and their versions."""
    membw_all_gbs: float | None = None
    """Memory read bandwidth, all cores, GB/s; None until measured."""
    membw_one_gbs: float | None = None
    """Memory read bandwidth, one core, GB/s."""
    cpu_calibration: CpuCalibration | None = None
    """This node's own CPU speed constants, from `llmgw plan calibrate`; None: the defaults."""
    gpus: list[GpuInfo] = field(default_factory=list)
    """Cards, or the MIG instances of a card carved into MIG."""
    driver_version: str = ""
    """NVIDIA driver; empty on a node without one."""
    cpu_flags: list[str] = field(default_factory=list)
    """The CPU features engines care about (avx2, avx512f, amx_tile, ...)."""
    os: str = ""
    """'<id> <version> (<codename>)' from /etc/os-release."""
    arch: str = ""
    filesystems: list[Filesystem] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


class Worker(Struct, kw_only=True):
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


class ReplicaState(Struct, kw_only=True):
    """Where a replica is and how it is doing."""

    id: Name
    model: Name
    profile: Name
    node: Name
    state: ReplicaStatus = "pending"
    url: str = ""
    """Base URL of the engine once it listens (http://host:port)."""
    api_key: str = ""
    """Key the engine demands; only the router uses it."""
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
    error: str = ""
    """Why it failed."""
    log_tail: list[str] = field(default_factory=list)
    """Last lines the engine printed, when it failed."""
    updated: float = 0.0
    """Unix time of this state."""


class NodeList(Struct, kw_only=True):
    """Every node the scheduler knows, as last reported, with when."""

    nodes: list[NodeInfo]
    last_seen: dict[str, float] = field(default_factory=dict)
    """Node -> Unix time of its last heartbeat."""


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


class Demand(Struct, kw_only=True):
    """When a model was last asked for: written by the router (at once when it has no ready
    replica: a wake-up; else at most every few seconds), read by the scheduler."""

    model: Name
    last_asked: float
    """Unix time of the latest request."""


class ModelStatusList(Struct, kw_only=True):
    """Every model's status."""

    models: list[ModelStatus]


class Heartbeat(Struct, kw_only=True):
    """An agent's periodic report."""

    info: NodeInfo
    replicas: list[ReplicaState] = field(default_factory=list)
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

    replica: ReplicaState
    model: Model
    profile: Profile


class WorkerStart(Struct, kw_only=True):
    """The scheduler's word to an agent: run this node's worker of a multi-node replica, and
    answer with where it listens once it does."""

    replica: ReplicaState
    model: Model
    profile: Profile


class ReplicaStop(Struct, kw_only=True):
    """The scheduler's word to an agent: stop this replica."""

    id: Name
    reason: str = ""


class ReplicaList(Struct, kw_only=True):
    """Replicas the scheduler keeps."""

    replicas: list[ReplicaState]


class FileRef(Struct, kw_only=True):
    """A weights file by its source."""

    source: Source


class FileInfo(Struct, kw_only=True):
    """A file the mirror holds."""

    source: str
    size: NonNegative
    sha256: str
    url: str
    """Where agents fetch it over HTTP (range requests allowed)."""


class FileList(Struct, kw_only=True):
    """Every file the mirror holds."""

    files: list[FileInfo]


class Limits(Struct, kw_only=True):
    """Limits of a key or a project; None: no limit. Enforced across every router."""

    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    """Prompt and completion tokens in a minute (checked before, counted after each request)."""
    concurrent: Positive | None = None
    """Requests in flight at once."""
    tokens_per_day: Positive | None = None
    """A budget: once spent, requests get 429 with `x-should-retry: false` until the next UTC day."""
    tokens_per_month: Positive | None = None
    """A budget for the UTC calendar month."""


class Project(Struct, kw_only=True):
    """A project: keys belong to one; its limits hold for all its keys together."""

    name: Name
    limits: Limits = field(default_factory=Limits)
    created: float = 0.0


class KeyCreate(Struct, kw_only=True):
    """Make an API key."""

    name: Name
    """A label for the key (who or what uses it)."""
    admin: bool = False
    """Whether it may use the admin API (/api/v1/)."""
    project: Name = "default"
    """The project it belongs to (made if missing, with no limits)."""
    expires_in_s: Positive | None = None
    """Seconds until it stops working; None: never."""
    models: list[Name] = field(default_factory=list)
    """Models (or aliases) it may use; empty: all."""
    limits: Limits = field(default_factory=Limits)


class KeyCreated(Struct, kw_only=True):
    """A new API key: shown once, stored only as its hash."""

    name: str
    key: str
    id: str = ""
    """The first 16 hex digits of its hash: how the admin API names it."""


class KeyRecord(Struct, kw_only=True):
    """What the keys bucket keeps of a key (under its sha256)."""

    name: str
    created: float
    admin: bool = False
    """Admin keys may use /api/v1/."""
    project: str = "default"
    expires: float | None = None
    """Unix time it stops working."""
    models: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)


class KeyList(Struct, kw_only=True):
    """Every key (never the key itself: its id and what it may do)."""

    keys: dict[str, KeyRecord]
    """Key id -> record."""


class KeyRef(Struct, kw_only=True):
    """One key by its id (the first 16 hex digits of its hash)."""

    id: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}$")]


class UsageRecord(Struct, kw_only=True):
    """One request as the router saw it: published to the usage stream after it ended."""

    request_id: str
    time: float
    key: str
    """The key's id."""
    project: str
    model: str
    replica: str = ""
    status: int = 200
    prompt_tokens: NonNegative = 0
    cached_tokens: NonNegative = 0
    """Prompt tokens the engine served from its cache."""
    completion_tokens: NonNegative = 0
    latency_s: float = 0.0
    ttft_s: float | None = None
    """Time to the first token, for streams."""


class UsageQuery(Struct, kw_only=True):
    """Sum usage since a time, grouped by one field."""

    since: float = 0.0
    group_by: Literal["model", "project", "key", "replica"] = "model"


class UsageRow(Struct, kw_only=True):
    """The sums of one group."""

    group: str
    requests: NonNegative = 0
    errors: NonNegative = 0
    prompt_tokens: NonNegative = 0
    cached_tokens: NonNegative = 0
    completion_tokens: NonNegative = 0


class UsageReport(Struct, kw_only=True):
    """Usage sums, one row per group."""

    rows: list[UsageRow]


def all_messages() -> list[type[Struct]]:
    """Every message type, for the JSON Schema golden file."""
    return [
        Empty,
        ScheduleWindow,
        Scaling,
        Profile,
        Model,
        CatalogRecord,
        ModelEntry,
        ModelPut,
        ModelRef,
        ModelPurge,
        FilePlace,
        PurgeReport,
        WeightsCollect,
        WeightsDelete,
        WeightsDeleted,
        ChangeSpec,
        ModelChange,
        ModelList,
        CpuCalibration,
        GpuInfo,
        Filesystem,
        NodeInfo,
        NodeList,
        ModelStatus,
        ModelStatusList,
        Demand,
        Limits,
        Project,
        KeyList,
        KeyRef,
        UsageRecord,
        UsageQuery,
        UsageRow,
        UsageReport,
        ReplicaState,
        Heartbeat,
        ReplicaStart,
        WorkerStart,
        ReplicaStop,
        ReplicaList,
        FileRef,
        FileInfo,
        FileList,
        KeyCreate,
        KeyCreated,
        KeyRecord,
    ]


def schema_json() -> bytes:
    """The JSON Schema of every message, as the golden file keeps it."""
    _, components = msgspec.json.schema_components(all_messages())
    return msgspec.json.format(msgspec.json.encode(components), indent=2) + b"\n"
