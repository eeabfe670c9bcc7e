"""The audit trail: every change (the catalog's, the mirror's, keys, projects, users, tenants)
published to the audit stream, which the router keeps (`llmgw_audit`), and read back newest
first (`read_back`). Nothing secret goes in: a user's password hash is left out of what a
change was and became."""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext

from llmgw.bus import audited, event_stream, get_logger
from llmgw.proto import AUDIT_STREAM
from llmgw.proto.people import AUDIT, AuditEntry, AuditLog, AuditQuery
from llmgw.router.usage.recent import Tail, read_back

__all__ = ["AUDIT_DAYS", "Audit"]

AUDIT_DAYS = 400
"""How long the audit stream keeps a change (a year and a bit)."""


def _entries(data: bytes) -> list[AuditEntry]:
    return [msgspec.json.decode(data, type=AuditEntry)]


_TAIL: Tail[AuditEntry] = Tail(AUDIT_STREAM, _entries, lambda e: e.time)


class Audit:
    """Records changes and reads them back."""

    def __init__(self, nc, js: JetStreamContext) -> None:
        self.nc, self.js = nc, js
        self.log = get_logger("router")

    @classmethod
    async def open(cls, nc, js: JetStreamContext) -> Audit:
        """Make sure the audit stream exists (kept `AUDIT_DAYS`)."""
        await event_stream(js, AUDIT_STREAM, [AUDIT.all], AUDIT_DAYS)
        return cls(nc, js)

    async def record(self, change: AuditEntry, before: object = None, after: object = None) -> None:
        """Keep `change` with what it was and became (logged where the stream does not take it:
        the change itself stands)."""
        entry = audited(change, before, after)
        try:
            await self.js.publish(AUDIT.subject(entry.area), msgspec.json.encode(entry), timeout=5)
        except Exception as exc:  # the change was made: say that its record was not
            self.log.warning(
                "change not recorded in the audit trail",
                area=entry.area,
                subject=entry.subject,
                who=entry.who,
                error=str(exc) or type(exc).__name__,
            )

    async def read(self, query: AuditQuery) -> AuditLog:
        """The page `query` names, newest first."""

        def wanted(e: AuditEntry) -> bool:
            return (
                (not query.area or e.area == query.area)
                and (not query.subject or e.subject == query.subject)
                and (not query.tenant or e.tenant == query.tenant)
            )

        got, after = await read_back(self.nc, self.js, _TAIL, (query.before, query.limit), wanted)
        return AuditLog(entries=got, next=after)
