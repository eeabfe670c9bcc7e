"""Changes put on the audit trail (`llmgw.v1.evt.audit.<area>`, which the router's stream keeps):
what every service that changes something operators own calls."""

from __future__ import annotations

import time

import msgspec
from nats.aio.client import Client

from llmgw.proto.people import AUDIT, AuditEntry

__all__ = ["as_json", "audited", "record_change"]

_SECRET_FIELDS = frozenset({"password", "bind_password", "client_secret"})


def _masked(plain: object) -> object:
    """Builtins with every secret field's value written `***`, however deep."""
    if isinstance(plain, dict):
        return {k: ("***" if k in _SECRET_FIELDS and v else _masked(v)) for k, v in plain.items()}
    if isinstance(plain, list):
        return [_masked(v) for v in plain]
    return plain


def as_json(value: object) -> str:
    """A value as an audit entry keeps it: JSON, its secret fields written `***`; "" for None."""
    if value is None:
        return ""
    return msgspec.json.encode(_masked(msgspec.to_builtins(value))).decode()


def audited(change: AuditEntry, before: object = None, after: object = None) -> AuditEntry:
    """`change` (who, what, to which) with when, and what it was and became (no secret)."""
    return msgspec.structs.replace(
        change,
        time=change.time or time.time(),
        who=change.who or "unknown",
        before=as_json(before),
        after=as_json(after),
    )


async def record_change(nc: Client, change: AuditEntry, before: object = None, after: object = None) -> None:
    """Put `change` on the audit trail (published, not waited on: the change itself stands)."""
    await nc.publish(AUDIT.subject(change.area), msgspec.json.encode(audited(change, before, after)))
