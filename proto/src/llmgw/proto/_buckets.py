"""The JetStream KV buckets: what each keeps under which key, and who alone writes it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUDIT_STREAM",
    "BUCKETS",
    "BUCKET_TABLE",
    "KB_CHUNKS",
    "KB_FILES",
    "TOOL_STREAM",
    "USAGE_STREAM",
    "Bucket",
]


@dataclass(frozen=True)
class Bucket:
    """One KV bucket."""

    role: str
    """How code names it (`BUCKETS[role]`)."""
    name: str
    key: str
    value: str
    writer: str


BUCKET_TABLE = (
    Bucket("catalog", "llmgw_catalog", "model name", "`CatalogRecord`", "catalog"),
    Bucket(
        "replicas",
        "llmgw_replicas",
        "replica id",
        "`ReplicaState` (spec and report merged; `draining` while it is being stopped; gone once stopped)",
        "scheduler",
    ),
    Bucket("keys", "llmgw_keys", "sha256 of an API key", "`KeyRecord`", "router"),
    Bucket(
        "leader",
        "llmgw_leader",
        "`scheduler`",
        "the leading instance's id (values expire after `lease_s`)",
        "scheduler",
    ),
    Bucket("status", "llmgw_status", "model name", "`ModelStatus`", "the leading scheduler"),
    Bucket(
        "demand",
        "llmgw_demand",
        "model name",
        "`Demand` (when it was last asked for: wakes an on-demand model)",
        "router",
    ),
    Bucket("projects", "llmgw_projects", "project name", "`Project` (its limits)", "router"),
    Bucket(
        "limits",
        "llmgw_limits",
        "`key.<id>`, `project.<name>` or `tenant.<name>`",
        "`{m: [minute, requests, tokens], d: [day, tokens], mo: [month, tokens], c: {router: [in flight, time]}}` "
        "(compare-and-set; values expire after 32 days)",
        "every router",
    ),
    Bucket(
        "usage_slots",
        "llmgw_usage_slots",
        "`<slot start>.<group>.<part>` or `rolled`",
        "`UsageSlot` (a 5-minute slot's usage sums, from the usage stream; values expire with it) or `UsageRolled`",
        "every router (the same entries from the same stream)",
    ),
    Bucket("users", "llmgw_users", "user name", "`User` (its roles per tenant; a local user's argon2 hash)", "router"),
    Bucket("tenants", "llmgw_tenants", "tenant name", "`Tenant` (the models it may use)", "router"),
    Bucket("guard", "llmgw_guard", "`<tenant>.<name>`", "`Policy` (a guardrail policy)", "router"),
    Bucket(
        "answer_cache", "llmgw_answer_cache", "`<tenant>.<model>`", "`AnswerCache` (how answers are kept)", "router"
    ),
    Bucket(
        "answers",
        "llmgw_answers",
        "`<tenant>.<model>.<sha256 of the conversation, 32 hex>`",
        "`CachedAnswer` (an answer kept, with its question's vector; values expire after 30 days)",
        "router",
    ),
    Bucket("kb", "llmgw_kb", "`<tenant>.<name>`", "`KnowledgeBase`", "router"),
    Bucket(
        "mcp", "llmgw_mcp", "`<tenant>.<name>`", "`McpServer` (its headers sealed under the fleet's secret)", "router"
    ),
    Bucket(
        "providers",
        "llmgw_providers",
        "provider name",
        "`Provider` (its keys sealed under the fleet's secret)",
        "router",
    ),
    Bucket("mcp_rules", "llmgw_mcp_rules", "`<tenant>.<tenant|project|key>.<target>`", "`ToolRule`", "router"),
    Bucket(
        "kb_docs",
        "llmgw_kb_docs",
        "`<tenant>.<base>.<sha256 of the path, 32 hex>`",
        "`Document` (where it sits, how far it is; its file in the object store `llmgw_kb_files` under "
        "the same key, its chunks in `llmgw_kb_chunks` under the key, a dot and its sha256's first 16 hex)",
        "router",
    ),
    Bucket(
        "fleet",
        "llmgw_fleet",
        "`node.<name>` or `router.<instance>`",
        "`FleetMember` (where each machine is: what the nodes' firewalls let in)",
        "each agent its own node's, each router its own",
    ),
    Bucket(
        "hooks", "llmgw_hooks", "`<tenant>.<name>`", "`Hook` (its secret sealed under the fleet's secret)", "router"
    ),
    Bucket(
        "hook_dead",
        "llmgw_hook_dead",
        "`<tenant>.<hook>.<time>`",
        "`DeadLetter` (a notice that never got through; kept 7 days)",
        "router",
    ),
    Bucket(
        "settings",
        "llmgw_settings",
        "`signin`",
        "`SignInSettings` (its secrets sealed under the fleet's secret)",
        "router",
    ),
)
"""Every bucket, as docs/subjects.md lists them."""

BUCKETS = {b.role: b.name for b in BUCKET_TABLE}
"""Role -> bucket name."""

USAGE_STREAM = "llmgw_usage"
"""The stream that keeps `evt.usage.>` (every finished request)."""
AUDIT_STREAM = "llmgw_audit"
"""The stream that keeps `evt.audit.*` (every change: who, when, from what to what)."""

TOOL_STREAM = "llmgw_tool_calls"
"""The stream that keeps `evt.tool.*` (every tool called through the gateway)."""

KB_FILES = "llmgw_kb_files"
"""The object store of knowledge documents as they were sent (key: the `kb_docs` key)."""
KB_CHUNKS = "llmgw_kb_chunks"
"""The object store of each document's chunks and their vectors (`knowledge.Chunks`, msgpack)."""
