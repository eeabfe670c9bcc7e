"""`llmgw access`: a cluster's NATS identities, written by the operator without NATS running.

`llmgw access write DIR --node NAME ...` keeps one nkey seed per service, per agent node and for
the operator in DIR/creds (0600; those already there are kept, so a second run changes no one's
key, and the nodes written before stay in), the scheduler's public key for the agents
(DIR/creds/scheduler.pub: they act only on starts and stops it signed), and writes
DIR/nats/authorization.conf, the block every cluster server `include`s: public keys and
permissions, no secret. `llmgw access table` prints who may do what (docs/security.md shows it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from llmgw.bus import (
    CredentialsError,
    Identity,
    authorization_config,
    new_fleet_secret,
    new_identity,
    node_secret,
    permissions,
    read_identity,
    write_identity,
    write_secret,
)
from llmgw.ctl.access_table import HEADER, role_row

__all__ = [
    "NODE_NAME",
    "access_table",
    "add_access_parser",
    "agent_nodes",
    "engine_secret_file",
    "ensure_engine_secrets",
    "ensure_identities",
    "scheduler_key_file",
    "write_access",
]

SERVICE_ROLES = ("catalog", "scheduler", "mirror", "router")
NODE_NAME = _NODE = re.compile(r"[A-Za-z0-9_-]{1,63}")
"""What a node may be named: a NATS subject token."""

NEXT_STEPS = """\
next:
  every NATS server: {conf} beside its cluster.conf (/etc/nats/), then `nats-server --signal reload`
  each service's machine: its seed as /etc/llmgw/creds/<role>.nk (root's, 0600)
  each agent node: {creds}/agent-<node>.nk as /etc/llmgw/creds/agent.nk on that node,
    {creds}/engine-<node>.secret as /etc/llmgw/creds/engine.secret (its engine_secret), and
    {creds}/scheduler.pub as /etc/llmgw/creds/scheduler.pub (its scheduler_key: public)
  the router's machine: {creds}/engine-fleet.secret as /etc/llmgw/creds/engine.secret
  the operator: `llmgw ctl --creds {creds}/ctl.nk` (or LLMGW_CREDS); see docs/security.md"""


def _file(folder: Path, role: str, node: str = "") -> Path:
    """Where an identity's seed is kept: <role>.nk, or agent-<node>.nk (the name `llmgw up` uses)."""
    return folder / (f"agent-{node}.nk" if node else f"{role}.nk")


def scheduler_key_file(folder: Path) -> Path:
    """Where the scheduler's public key is kept for the agents (their `scheduler_key`)."""
    return folder / "scheduler.pub"


def ensure_identities(folder: Path, wanted: list[tuple[str, str]]) -> list[tuple[Identity, Path, bool]]:
    """Each (role, node) wanted: read from its seed file in `folder`, or made and written (0600) when
    there is none; with its file and whether it is new. A kept file is made 0600 again. The
    scheduler's public key goes beside them (`scheduler_key_file`, 0644: the agents check its
    signature with it)."""
    out = []
    for role, node in wanted:
        path = _file(folder, role, node)
        new = not path.exists()
        if new:
            identity = new_identity(role, node)
            write_identity(path, identity)
        else:
            identity = read_identity(path, role, node)
            path.chmod(0o600)
        if role == "scheduler":
            public = scheduler_key_file(folder)
            if not public.exists() or public.read_text().strip() != identity.public:
                public.write_text(identity.public + "\n")
            public.chmod(0o644)
        out.append((identity, path, new))
    return out


def engine_secret_file(folder: Path, node: str = "") -> Path:
    """Where an engine secret is kept: engine-fleet.secret (the router's), engine-<node>.secret."""
    return folder / (f"engine-{node}.secret" if node else "engine-fleet.secret")


def ensure_engine_secrets(folder: Path, nodes: list[str]) -> list[tuple[Path, bool]]:
    """The fleet's engine secret (made when there is none) and each node's, worked out from it
    (written when missing, or when it is not the one the fleet secret gives: a fleet secret made
    anew); each file with whether it is new. Kept files are made 0600 again."""
    fleet = engine_secret_file(folder)
    out = [(fleet, not fleet.exists())]
    if out[0][1]:
        write_secret(fleet, new_fleet_secret())
    fleet.chmod(0o600)
    for node in nodes:
        path = engine_secret_file(folder, node)
        line = node_secret(fleet.read_text(), node)
        new = not path.exists() or path.read_text().strip() != line  # none, or one of another fleet secret
        if new:
            write_secret(path, line)
        path.chmod(0o600)
        out.append((path, new))
    return out


def agent_nodes(creds: Path) -> list[str]:
    """The nodes whose agents have an identity in `creds` (agent-<node>.nk), by name."""
    return sorted(n for n in (p.stem.removeprefix("agent-") for p in creds.glob("agent-*.nk")) if _NODE.fullmatch(n))


def _nodes(creds: Path, given: list[str]) -> list[str]:
    """The nodes written before (their agent-<node>.nk files), then those given that are new."""
    wrong = [n for n in given if not _NODE.fullmatch(n)]
    if wrong:
        raise ValueError(
            f"node name {wrong[0]!r} cannot be a NATS subject token: use letters, digits, '-' and '_' "
            "(at most 63), the agent's `node` setting (by default its short hostname)"
        )
    nodes = list(dict.fromkeys([*agent_nodes(creds), *given]))
    if not nodes:
        raise ValueError("no agent node yet: name the cluster's nodes with --node NAME (one for each agent)")
    return nodes


def write_access(
    folder: Path, nodes: list[str]
) -> tuple[list[tuple[Identity, Path, bool]], list[tuple[Path, bool]], Path]:
    """Every identity of a cluster with these agent `nodes` (and those written before) in
    `folder`/creds with the engine secrets (the fleet's, each node's), and
    `folder`/nats/authorization.conf letting in only those identities."""
    creds = folder / "creds"
    wanted = [(role, "") for role in (*SERVICE_ROLES, "ctl")] + [("agent", n) for n in _nodes(creds, nodes)]
    written = ensure_identities(creds, wanted)
    secrets = ensure_engine_secrets(creds, [node for role, node in wanted if role == "agent"])
    conf = folder / "nats" / "authorization.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    part = conf.with_suffix(".part")  # a server reloading meanwhile reads the old file or the new one
    part.write_text(
        "# Written by `llmgw access write`: who may sign in to NATS and what each may do. Public keys\n"
        "# only; include it from every server's configuration (deploy/nats/cluster.conf).\n"
        + authorization_config([identity for identity, _, _ in written])
    )
    part.chmod(0o644)
    part.replace(conf)
    return written, secrets, conf


def access_table() -> str:
    """Who may do what on NATS, one Markdown row per role, from the permissions the server enforces."""
    rows = [HEADER]
    for role in (*SERVICE_ROLES, "agent", "ctl"):
        node = "<node>" if role == "agent" else ""
        allowed = permissions(Identity(role=role, node=node, seed="", public=""))
        label = {"agent": "agent (each node its own)", "ctl": "ctl (the operator)"}.get(role, role)
        rows.append(role_row(label, allowed.publish, allowed.subscribe))
    return "\n".join(rows) + "\n"


def _write(args: argparse.Namespace) -> int:
    try:
        written, secrets, conf = write_access(Path(args.dir), args.node or [])
    except (ValueError, OSError) as exc:
        print(f"llmgw access write: {exc}", file=sys.stderr)
        return 2
    except CredentialsError as exc:
        print(f"llmgw access write: {exc.message}; move the file away to make a new identity", file=sys.stderr)
        return 2
    for identity, path, new in written:
        print(f"{'new ' if new else 'kept'}  {path}  ({identity.user})")
    for path, new in secrets:
        whose = "the router's" if path.stem.endswith("fleet") else "its node's agent's"
        print(f"{'new ' if new else 'kept'}  {path}  (engine keys: {whose})")
    public = scheduler_key_file(Path(args.dir) / "creds")
    print(f"pub   {public}  (the scheduler's public key: every agent's scheduler_key)")
    print(f"wrote {conf}: these {len(written)} identities may sign in, each with its role's permissions")
    print(NEXT_STEPS.format(conf=conf, creds=Path(args.dir) / "creds"))
    return 0


def _table(_: argparse.Namespace) -> int:
    print(access_table(), end="")
    return 0


def add_access_parser(sub: argparse._SubParsersAction) -> None:
    """`llmgw access write DIR --node NAME ...` and `llmgw access table`."""
    access = sub.add_parser(
        "access",
        help="write a cluster's NATS credentials and authorization (NATS need not run)",
        description="A cluster's NATS identities and who may do what (docs/security.md).",
    )
    verbs = access.add_subparsers(dest="verb", required=True)
    write = verbs.add_parser(
        "write",
        help="every identity's seed in DIR/creds (0600, kept if there) and DIR/nats/authorization.conf",
        epilog="example: llmgw access write /root/llmgw-access --node gpu-1 --node gpu-2 "
        "(later, to add a node: llmgw access write /root/llmgw-access --node gpu-3)",
    )
    write.add_argument("dir", metavar="DIR", help="where the credentials and the authorization block are kept")
    write.add_argument(
        "--node",
        action="append",
        metavar="NAME",
        help="an agent's node (its `node` setting, by default its short hostname); repeat it; "
        "nodes written before stay in (remove DIR/creds/agent-NAME.nk to drop one)",
    )
    write.set_defaults(run=_write)
    verbs.add_parser("table", help="who may do what on NATS, as a Markdown table").set_defaults(run=_table)
