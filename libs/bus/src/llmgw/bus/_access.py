"""Who may do what on NATS: an identity (an nkey) for each service, each node's agent and the
operator, the subjects and buckets each role needs, and the nats-server configuration that
enforces them.

Why nkeys: the server keeps only public keys (its configuration holds no secret), each process
proves who it is by signing the server's nonce with its own seed (a file readable by it alone),
and the roles are few and fixed. Decentralised JWT auth (operators, accounts, a resolver) pays
where tenants add users at run time; llmgw's users are its own services, written once by
`llmgw up` or by the operator's deployment, so a static configuration is the smaller thing to
trust. Each identity's replies come to inboxes under its own prefix (`_INBOX.<public key>`),
so no role can read another's answers.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec
import nkeys

from llmgw.bus._proc import write_private
from llmgw.proto import (
    AUDIT_STREAM,
    BUCKETS,
    KB_CHUNKS,
    KB_FILES,
    PREFIX,
    TOOL_STREAM,
    USAGE_STREAM,
    agent,
    catalog,
    guard,
    hooks,
    knowledge,
    mirror,
    people,
    providers,
    release,
    router,
    scheduler,
    tools,
)
from llmgw.proto.errors import BusError

__all__ = [
    "ROLES",
    "Cluster",
    "CredentialsError",
    "Identity",
    "Permissions",
    "TlsFiles",
    "authorization_config",
    "inbox_prefix",
    "new_identity",
    "permissions",
    "read_identity",
    "server_config",
    "write_identity",
]

ROLES = ("catalog", "scheduler", "mirror", "router", "agent", "ctl")
"""The roles that connect to NATS; `agent` is one identity per node, `ctl` is the operator."""


class CredentialsError(BusError):
    """Credentials that cannot be used: a missing or unreadable file, a seed that is not one."""

    code = "400"


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """Who connects: a role (and the node, for an agent) and its nkey."""

    role: str
    node: str = ""
    seed: str
    """The nkey seed (SU...): the secret; kept in a file readable by its process alone."""
    public: str
    """The public key (U...): what the server's configuration names."""

    @property
    def user(self) -> str:
        """A readable name for logs and files: the role, or `agent-<node>`."""
        return f"agent-{self.node}" if self.role == "agent" else self.role


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """What one identity may publish and subscribe to (anything else the server refuses)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


class TlsFiles(msgspec.Struct, frozen=True, kw_only=True):
    """The server's certificate and key, and the CA its clients are checked against."""

    cert: str
    key: str
    ca: str
    verify: bool = False
    """Ask every client for a certificate signed by `ca` (mutual TLS)."""


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    """A nats-server as one member of a cluster: its name among them, where it takes the other
    members' routes, every member's route address (its own among them: the server skips it), and
    the TLS they speak (mutual: each member's certificate signed by the fleet's CA)."""

    server_name: str
    host: str
    port: int = 6222
    routes: tuple[str, ...]
    """Each member's `host:port`."""
    tls: TlsFiles
    name: str = "llmgw"

    def config(self) -> str:
        """The `server_name` line and the `cluster` block (after `server_config`'s lines)."""
        routes = ", ".join(f'"nats-route://{route}"' for route in self.routes)
        files = f'cert_file: "{self.tls.cert}", key_file: "{self.tls.key}", ca_file: "{self.tls.ca}"'
        return (
            f'server_name: "{self.server_name}"\n'
            f'cluster {{ name: "{self.name}", listen: "{self.host}:{self.port}", routes: [{routes}]\n'
            f"  tls {{ {files}, verify: true, timeout: 5 }} }}\n"
        )


def new_identity(role: str, node: str = "") -> Identity:
    """A fresh nkey for `role` (and `node`, for an agent)."""
    if role not in ROLES:
        raise CredentialsError(f"no role '{role}'; the roles are {', '.join(ROLES)}")
    if (role == "agent") != bool(node):
        raise CredentialsError("an agent's identity names its node, and only an agent's does")
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()
    return Identity(role=role, node=node, seed=seed, public=nkeys.from_seed(seed.encode()).public_key.decode())


def write_identity(path: Path, identity: Identity) -> None:
    """Write the identity's credentials file (its seed, readable by its owner alone: 0600)."""
    write_private(path, identity.seed + "\n")


def read_identity(path: Path | str, role: str = "", node: str = "") -> Identity:
    """The identity in a credentials file; a CredentialsError says which file and what is wrong."""
    path = Path(path)
    try:
        seed = path.read_text().strip()
    except OSError as exc:
        raise CredentialsError(
            f"credentials {path}: {exc.strerror}; `llmgw up` writes them under <data>/creds/"
        ) from None
    if not seed.startswith("SU"):
        raise CredentialsError(f"credentials {path}: not an nkey user seed (it should start with 'SU')")
    try:
        public = nkeys.from_seed(seed.encode()).public_key.decode()
    except Exception:
        raise CredentialsError(f"credentials {path}: the seed does not decode (damaged or cut short)") from None
    return Identity(role=role, node=node, seed=seed, public=public)


def inbox_prefix(public: str) -> str:
    """Where replies to this identity's requests arrive: only it may subscribe there."""
    return f"_INBOX.{public}"


def _kv(bucket: str, write: bool) -> list[str]:
    """Reading (and with `write`, writing) one KV bucket through JetStream."""
    subjects = _reading(f"KV_{bucket}")
    return [*subjects, f"$KV.{bucket}.>"] if write else subjects


def _reading(stream: str) -> list[str]:
    """The JetStream calls that read a KV bucket's or object store's stream (and make it)."""
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _objects(bucket: str) -> list[str]:
    """Reading and writing one object store through JetStream."""
    return [
        *_reading(f"OBJ_{bucket}"),
        f"$JS.API.STREAM.PURGE.OBJ_{bucket}",  # an object replaced or deleted: its old chunks purged
        "$JS.API.STREAM.NAMES",  # reading an object finds its stream by subject first (nats-py)
        f"$O.{bucket}.>",
    ]


def _calls(*endpoints) -> list[str]:
    """Asking these endpoints (of any node, for per-node ones and those that speak for one)."""
    return [e.pattern for e in endpoints]


_MIRROR_ADMIN = (
    mirror.REPO_ADD,
    mirror.REPO_LIST,
    mirror.REPO_SHOW,
    mirror.REPO_REMOVE,
    mirror.REPO_UPDATE,
    mirror.FILE_LIST,
    mirror.FILE_STAT,
)
"""What an operator asks the mirror (`llmgw ctl mirror`, the admin API)."""


def _stream(name: str, subject: str) -> list[str]:
    """A stream the router keeps: publishing to it, and reading it back."""
    return [
        subject,
        f"$JS.API.STREAM.CREATE.{name}",
        f"$JS.API.STREAM.UPDATE.{name}",
        f"$JS.API.STREAM.INFO.{name}",
        f"$JS.API.CONSUMER.CREATE.{name}",
        f"$JS.API.CONSUMER.CREATE.{name}.>",
        f"$JS.API.CONSUMER.DELETE.{name}.>",
        f"$JS.API.CONSUMER.INFO.{name}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{name}.>",
        f"$JS.ACK.{name}.>",
    ]


_ROUTER_BUCKETS = (
    *("keys", "projects", "limits", "demand", "usage_slots", "users", "tenants", "settings", "hooks"),
    *("hook_dead", "guard", "kb", "kb_docs", "answer_cache", "answers", "mcp", "mcp_rules", "providers"),
)
"""The buckets the router writes."""


def _role_publish(role: str, node: str) -> list[str]:
    """What `role` publishes besides replies: its events, the requests it makes, its buckets."""
    b = BUCKETS
    if role == "catalog":
        return [
            # stat: a model's file reads; adapter.check: an adapter fits it; the nodes: what a serve plan sizes on
            *_calls(agent.WEIGHTS_DELETE, mirror.FILE_DELETE, mirror.FILE_STAT, mirror.HUB_SEARCH, scheduler.NODE_LIST),
            *_calls(mirror.ADAPTER_CHECK),
            people.AUDIT.subject("catalog"),  # every change to a model, for the audit trail
            *_kv(b["catalog"], write=True),
            *_kv(b["replicas"], write=False),
        ]
    if role == "scheduler":
        return [
            *_calls(agent.REPLICA_START, agent.REPLICA_STOP, agent.WORKER_START, agent.WORKER_STOP, mirror.FILE_STAT),
            *(s for name in ("replicas", "leader", "status") for s in _kv(b[name], write=True)),
            *(s for name in ("catalog", "demand") for s in _kv(b[name], write=False)),
        ]
    if role == "router":
        return [
            # its admin API and console: the catalog's and the mirror's; the fleet as the scheduler
            # sees it; keys, usage, the request log, users, tenants and the audit trail, which any
            # router answers
            *_calls(
                *catalog.ENDPOINTS,
                *_MIRROR_ADMIN,
                scheduler.NODE_LIST,
                scheduler.REPLICA_LIST,
                scheduler.MODEL_STATUS,
                scheduler.MODEL_ROOM,
                *router.ENDPOINTS,
                release.RELEASE_LIST,  # the fleet page: each machine's release
                *people.ENDPOINTS,
                *hooks.ENDPOINTS,
                *guard.ENDPOINTS,
                *knowledge.ENDPOINTS,
                *tools.ENDPOINTS,
                *providers.ENDPOINTS,
            ),
            *_stream(USAGE_STREAM, router.USAGE.all),
            *_stream(AUDIT_STREAM, people.AUDIT.all),  # users, tenants, keys: and the trail read back
            *_stream(TOOL_STREAM, tools.TOOL_CALL.all),
            *(s for name in _ROUTER_BUCKETS for s in _kv(b[name], write=True)),
            *_objects(KB_FILES),
            *_objects(KB_CHUNKS),
            *(s for name in ("catalog", "replicas", "status", "fleet") for s in _kv(b[name], write=False)),
            f"$KV.{b['fleet']}.router.>",  # where routers are, for the nodes' firewalls
        ]
    if role == "agent":
        return [
            agent.HEARTBEAT.subject(node),
            f"{PREFIX}.evt.replica.{node}.>",
            release.RELEASE_CHANGED.subject(node),
            scheduler.NODE_REGISTER.subject(node),  # it registers its own node only
            *_calls(mirror.FILE_STAT, mirror.FILE_WHERE),
            *_kv(BUCKETS["fleet"], write=False),  # where the fleet is (its firewall lets in only that)
            f"$KV.{BUCKETS['fleet']}.node.{node}",  # and where its own node is, nobody else's
        ]
    if role == "ctl":
        endpoints = (
            *catalog.ENDPOINTS,
            *(e for e in scheduler.ENDPOINTS if e is not scheduler.NODE_REGISTER),  # nodes register themselves
            *router.ENDPOINTS,
            *people.ENDPOINTS,
            *hooks.ENDPOINTS,
            *guard.ENDPOINTS,
            *knowledge.ENDPOINTS,
            *tools.ENDPOINTS,
            *providers.ENDPOINTS,
            *_MIRROR_ADMIN,
            agent.WEIGHTS_COLLECT,
            release.RELEASE_SET,
            release.RELEASE_LIST,
        )
        return ["$SRV.>", *_calls(*endpoints)]  # and nats.micro's discovery: `nats micro ls`
    if role == "mirror":
        # its fetches' progress; repos added and removed, for the audit trail; the catalog's
        # models (a repo a model uses is not removed)
        return [mirror.FETCH_CHANGED.all, people.AUDIT.subject("mirror"), *_calls(catalog.MODEL_LIST)]
    return []


def _role_subscribe(role: str, node: str) -> list[str]:
    """What `role` listens to besides its own inboxes: the endpoints it serves, events it follows."""
    if role == "agent":
        every = (agent.WEIGHTS_DELETE, agent.WEIGHTS_COLLECT, release.RELEASE_LIST)
        return [f"{PREFIX}.agent.{node}.>", *(e.subject() for e in every)]
    if role == "scheduler":
        return [f"{PREFIX}.scheduler.>", agent.HEARTBEAT.all, f"{PREFIX}.evt.replica.>"]
    if role == "router":  # and what its notifier tells tenants of: replicas failing, fetches failing
        return [f"{PREFIX}.router.>", agent.REPLICA_CHANGED.all, mirror.FETCH_CHANGED.all, release.RELEASE_CHANGED.all]
    if role in ("catalog", "mirror"):
        return [f"{PREFIX}.{role}.>"]
    # The operator watches every event (`nats sub 'llmgw.v1.evt.>'`) but no service's requests:
    # it could answer them, speaking for the service.
    return [f"{PREFIX}.evt.>"]


def permissions(identity: Identity) -> Permissions:
    """What `identity` may do: its role's subjects and buckets, nats.micro's discovery, and its own
    inboxes; it may answer whoever asks it (`allow_responses`: one reply per request delivered to
    it, on the reply subject the asker named; the service runner answers only on inboxes)."""
    role, node = identity.role, identity.node
    publish = ["$JS.API.INFO", *_role_publish(role, node)]
    subscribe = [f"{inbox_prefix(identity.public)}.>", *_role_subscribe(role, node)]
    if role != "ctl":
        subscribe.append("$SRV.>")  # nats.micro's PING, INFO and STATS
    return Permissions(publish=tuple(dict.fromkeys(publish)), subscribe=tuple(dict.fromkeys(subscribe)))


def _quoted(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{s}"' for s in items) + "]"


def authorization_config(identities: list[Identity], unrestricted: tuple[str, ...] = ()) -> str:
    """The nats-server `authorization` block that lets in only these identities, each with its
    role's permissions: part of `server_config`, and the file a cluster's servers `include`.
    `unrestricted` public keys may do anything (a break-glass identity kept offline; a test
    harness that plays the attacker).

    Answers are let out by `allow_responses` (one reply per request delivered, within its reply
    subject), not by a publish allow of `_INBOX.>`: that would let any role publish into any
    other's inboxes, and an inbox's tokens can be guessed from one seen (nats-py's are a counter
    and four random hex digits), so an agent asked once by the scheduler could forge the answers
    of other nodes' agents. The server cannot limit a response to inboxes; llmgw's services do
    (llmgw.bus.answerable)."""
    users = [f'    {{ nkey: "{public}" }}  # unrestricted' for public in unrestricted]
    for identity in identities:
        allowed = permissions(identity)
        users.append(
            f'    {{ nkey: "{identity.public}"  # {identity.user}\n'
            f"      permissions: {{\n"
            f"        publish: {{ allow: {_quoted(allowed.publish)} }}\n"
            f"        subscribe: {{ allow: {_quoted(allowed.subscribe)} }}\n"
            f"        allow_responses: true\n"
            f"      }} }}"
        )
    return "\n".join(["authorization {", "  users = [", *users, "  ]", "}"]) + "\n"


def server_config(
    identities: list[Identity],
    store_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4222,
    tls: TlsFiles | None = None,
    unrestricted: tuple[str, ...] = (),
) -> str:
    """The nats-server configuration: JetStream in `store_dir`, and only these identities let in,
    each with its role's permissions (TLS to clients when `tls` is given; `unrestricted` as in
    `authorization_config`). A cluster member's adds its `Cluster.config()`."""
    lines = [
        "# Written by llmgw: every client signs in with its own nkey and may do only what its role needs.",
        f'listen: "{host}:{port}"',
        f'jetstream {{ store_dir: "{store_dir}" }}',
        authorization_config(identities, unrestricted).rstrip("\n"),
    ]
    if tls is not None:
        verify = "true" if tls.verify else "false"
        files = f'cert_file: "{tls.cert}", key_file: "{tls.key}", ca_file: "{tls.ca}"'
        lines.append(f"tls {{ {files}, verify: {verify}, timeout: 5 }}")
    return "\n".join(lines) + "\n"
