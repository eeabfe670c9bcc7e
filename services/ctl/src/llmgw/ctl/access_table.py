"""Who may do what on NATS, as a table people read (docs/security.md, `llmgw access table`): each
role's subjects and buckets, summed up from the permissions the server enforces; without I/O."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.proto import PREFIX, agent, catalog, mirror, router, scheduler

__all__ = ["HEADER", "role_row"]

HEADER = (
    "| role | answers and follows | asks | publishes | writes | reads |\n"
    "|------|---------------------|------|-----------|--------|-------|"
)
"""The table's head: what a role subscribes to, the requests it sends, the events it publishes, the
buckets (and streams) it writes, and those it only reads."""

_SERVICES = (catalog, scheduler, router, mirror, agent)


def _short(subject: str) -> str:
    return subject.removeprefix(PREFIX + ".")


def _asks(subjects: list[str]) -> list[str]:
    """The requests, with a service's whole endpoint table said in two words."""
    out, left = [], list(subjects)
    for service in _SERVICES:
        every = [e.pattern for e in service.ENDPOINTS]
        if all(s in left for s in every):
            out.append(f"every {service.__name__.rsplit('.', 1)[-1]} endpoint")
            left = [s for s in left if s not in every]
    return out + [_short(s) for s in left]


def _stores(publish: Iterable[str]) -> tuple[list[str], list[str]]:
    """The buckets (and streams) written, and those only read, from the JetStream API subjects."""
    writes = [s.split(".")[1] for s in publish if s.startswith("$KV.")]
    reads = []
    for s in publish:
        if s.startswith("$JS.API.STREAM.INFO."):
            stream = s.rsplit(".", 1)[-1]
            bucket = stream.removeprefix("KV_")
            if bucket == stream:
                writes.append(stream)  # a stream of its own (the usage stream)
            elif bucket not in writes:
                reads.append(bucket)
    return writes, reads


def _cell(items: list[str]) -> str:
    return ", ".join(i if i.startswith("every ") else f"`{i}`" for i in items) or "—"


def role_row(role: str, publish: Iterable[str], subscribe: Iterable[str]) -> str:
    """One role's row: its permissions (`publish`, `subscribe` as the server holds them) summed up.
    Left out, as every role has them: its own inboxes, nats.micro's `$SRV` discovery, `$JS.API.INFO`."""
    publish = list(publish)
    follows = [_short(s) for s in subscribe if s.startswith(PREFIX)]
    on_bus = [s for s in publish if s.startswith(PREFIX)]
    events = [_short(s) for s in on_bus if s.startswith(f"{PREFIX}.evt.")]
    asks = _asks([s for s in on_bus if not s.startswith(f"{PREFIX}.evt.")])
    if "$SRV.>" in publish:
        asks.append("$SRV.>")  # nats.micro's discovery, asked
    writes, reads = _stores(publish)
    cells = [follows, asks, events, writes, reads]
    return f"| {role} | " + " | ".join(_cell(c) for c in cells) + " |"
