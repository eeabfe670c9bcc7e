"""llmgw's contracts: every NATS message as a msgspec Struct, and the subjects they travel on.

Payloads are JSON. Inside version v1 messages only gain fields with defaults;
a breaking change is v2, with new subjects.
"""

from llmgw.proto._messages import (
    CatalogRecord,
    ChangeSpec,
    Empty,
    FileInfo,
    FileList,
    FileRef,
    Heartbeat,
    KeyCreate,
    KeyCreated,
    KeyRecord,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPut,
    ModelRef,
    NodeInfo,
    Profile,
    ReplicaList,
    ReplicaStart,
    ReplicaState,
    ReplicaStop,
    Scaling,
    ScheduleWindow,
    all_messages,
)
from llmgw.proto._strict import StrictError, convert_strict
from llmgw.proto._subjects import BUCKETS, VERSION, Subjects

__all__ = [
    "BUCKETS",
    "VERSION",
    "CatalogRecord",
    "ChangeSpec",
    "Empty",
    "FileInfo",
    "FileList",
    "FileRef",
    "Heartbeat",
    "KeyCreate",
    "KeyCreated",
    "KeyRecord",
    "Model",
    "ModelEntry",
    "ModelChange",
    "ModelList",
    "ModelPut",
    "ModelRef",
    "NodeInfo",
    "Profile",
    "ReplicaList",
    "ReplicaStart",
    "ReplicaState",
    "ReplicaStop",
    "Scaling",
    "ScheduleWindow",
    "StrictError",
    "Subjects",
    "all_messages",
    "convert_strict",
]
