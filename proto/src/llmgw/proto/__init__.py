"""llmgw's contracts: every NATS message as a msgspec Struct, by the service that answers for it,
each module with its endpoint table (`ENDPOINTS`: subject, request, reply) and its events.

    from llmgw.proto import catalog
    entry = await call(nc, catalog.MODEL_GET, ModelRef(name="qwen"))   # a ModelEntry

Payloads are JSON. Inside version v1 messages only gain fields with defaults;
a breaking change is v2, with new subjects.
"""

from llmgw.proto import agent, catalog, errors, mirror, router, scheduler
from llmgw.proto._buckets import BUCKETS, USAGE_STREAM
from llmgw.proto._endpoint import PREFIX, VERSION, Endpoint, Event, type_name
from llmgw.proto._fingerprint import fingerprint
from llmgw.proto._json import JSON_MAX_DEPTH, JsonTooDeep, check_depth, decode_json
from llmgw.proto._schema import all_messages, schema_json, subjects_markdown
from llmgw.proto._strict import StrictError, convert_strict
from llmgw.proto._types import Empty, ReplicaStatus
from llmgw.proto.agent import Heartbeat, ReplicaStart, ReplicaStop, WeightsCollect, WorkerStart
from llmgw.proto.catalog import (
    CatalogRecord,
    ChangeSpec,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    Profile,
    PurgeReport,
    RestartModel,
    ScaleModel,
    Scaling,
    ScheduleWindow,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    StartModel,
    StopModel,
)
from llmgw.proto.mirror import FileInfo, FileList, FilePlace, FileRef, WeightsDelete, WeightsDeleted
from llmgw.proto.node import CpuCalibration, Filesystem, GpuInfo, NodeInfo
from llmgw.proto.replica import ReplicaReport, ReplicaSpec, ReplicaState, Worker
from llmgw.proto.router import (
    Demand,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRecord,
    KeyRef,
    Limits,
    Project,
    UsageQuery,
    UsageRecord,
    UsageReport,
    UsageRow,
)
from llmgw.proto.scheduler import ModelStatus, ModelStatusList, NodeList, ReplicaList

SERVICES = (catalog, scheduler, mirror, router, agent)
"""Every service's contract module, in the order docs/subjects.md lists them."""

__all__ = [
    "BUCKETS",
    "JSON_MAX_DEPTH",
    "PREFIX",
    "SERVICES",
    "USAGE_STREAM",
    "VERSION",
    "CatalogRecord",
    "ChangeSpec",
    "CpuCalibration",
    "Demand",
    "Empty",
    "Endpoint",
    "Event",
    "FileInfo",
    "FileList",
    "FilePlace",
    "FileRef",
    "Filesystem",
    "GpuInfo",
    "Heartbeat",
    "JsonTooDeep",
    "KeyCreate",
    "KeyCreated",
    "KeyList",
    "KeyRecord",
    "KeyRef",
    "Limits",
    "Model",
    "ModelChange",
    "ModelEntry",
    "ModelList",
    "ModelPurge",
    "ModelPut",
    "ModelRef",
    "ModelStatus",
    "ModelStatusList",
    "NodeInfo",
    "NodeList",
    "Profile",
    "Project",
    "PurgeReport",
    "ReplicaList",
    "ReplicaReport",
    "ReplicaSpec",
    "ReplicaStart",
    "ReplicaState",
    "ReplicaStatus",
    "ReplicaStop",
    "RestartModel",
    "ScaleModel",
    "Scaling",
    "ScheduleWindow",
    "SetAliases",
    "SetClass",
    "SetContext",
    "SetGpus",
    "SetOwner",
    "SetReplicas",
    "StartModel",
    "StopModel",
    "StrictError",
    "UsageQuery",
    "UsageRecord",
    "UsageReport",
    "UsageRow",
    "WeightsCollect",
    "WeightsDelete",
    "WeightsDeleted",
    "Worker",
    "WorkerStart",
    "agent",
    "all_messages",
    "catalog",
    "check_depth",
    "convert_strict",
    "decode_json",
    "errors",
    "fingerprint",
    "mirror",
    "router",
    "scheduler",
    "schema_json",
    "subjects_markdown",
    "type_name",
]
