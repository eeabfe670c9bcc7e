"""What every llmgw service stands on: NATS, typed requests, errors, logs, traces, admin HTTP."""

from llmgw.bus._access import (
    ROLES,
    Cluster,
    CredentialsError,
    Identity,
    Permissions,
    TlsFiles,
    authorization_config,
    inbox_prefix,
    new_identity,
    permissions,
    read_identity,
    server_config,
    write_identity,
)
from llmgw.bus._audit import as_json, audited, record_change
from llmgw.bus._call import call, call_all, request_raw
from llmgw.bus._config import ADMIN_PORTS, BusConfig, ConfigError, data_home, load_config
from llmgw.bus._engine_keys import EngineKeys, EngineSecretError, new_fleet_secret, node_secret, write_secret
from llmgw.bus._fleet import announce, nats_host
from llmgw.bus._gauges import ScrapeCollector, family
from llmgw.bus._http import HttpServer
from llmgw.bus._kvtable import KvTable
from llmgw.bus._llamacpp import LlamaCpp, find_llamacpp
from llmgw.bus._nats import (
    NatsServer,
    address_towards,
    connect,
    flushed,
    kv_bucket,
    kv_keys,
    kv_scan,
    set_storage_replicas,
    start_nats_server,
    storage_replicas,
)
from llmgw.bus._observe import get_logger, setup_logging, setup_tracing
from llmgw.bus._proc import collector_paused, delete_under, die_with_parent, free_port, meminfo_mb, write_private
from llmgw.bus._release import read_release, read_release_ask, release_python, write_release, write_release_ask
from llmgw.bus._service import INBOX, Context, ServiceApp, add_service, answerable, entry_point, run
from llmgw.bus._signing import SIGNATURE, SIGNED_AT, SignatureError, Signer, Verifier, public_key
from llmgw.bus._tasks import spawn
from llmgw.proto.errors import BadRequest, BusError, Conflict, Internal, NotFound

__all__ = [
    "ADMIN_PORTS",
    "INBOX",
    "ROLES",
    "SIGNATURE",
    "SIGNED_AT",
    "BadRequest",
    "BusConfig",
    "BusError",
    "Cluster",
    "ConfigError",
    "Conflict",
    "Context",
    "CredentialsError",
    "EngineKeys",
    "EngineSecretError",
    "HttpServer",
    "Identity",
    "Internal",
    "KvTable",
    "LlamaCpp",
    "NatsServer",
    "NotFound",
    "Permissions",
    "ScrapeCollector",
    "ServiceApp",
    "SignatureError",
    "Signer",
    "TlsFiles",
    "Verifier",
    "add_service",
    "address_towards",
    "announce",
    "answerable",
    "as_json",
    "audited",
    "authorization_config",
    "call",
    "call_all",
    "collector_paused",
    "connect",
    "data_home",
    "delete_under",
    "die_with_parent",
    "entry_point",
    "family",
    "find_llamacpp",
    "flushed",
    "free_port",
    "get_logger",
    "inbox_prefix",
    "kv_bucket",
    "kv_keys",
    "kv_scan",
    "load_config",
    "meminfo_mb",
    "nats_host",
    "new_fleet_secret",
    "new_identity",
    "node_secret",
    "permissions",
    "public_key",
    "read_identity",
    "read_release",
    "read_release_ask",
    "record_change",
    "release_python",
    "request_raw",
    "run",
    "server_config",
    "set_storage_replicas",
    "setup_logging",
    "setup_tracing",
    "spawn",
    "start_nats_server",
    "storage_replicas",
    "write_identity",
    "write_private",
    "write_release",
    "write_release_ask",
    "write_secret",
]
