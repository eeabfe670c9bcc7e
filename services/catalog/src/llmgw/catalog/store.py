"""The catalog bucket: reads, compare-and-set writes and removals."""

from __future__ import annotations

import time

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from opentelemetry import trace

from llmgw.bus import Conflict, NotFound, inject, kv_scan, record_change
from llmgw.proto import CatalogRecord, FileInfo, Model, ModelEntry
from llmgw.proto.people import AuditEntry

__all__ = ["ModelStore"]


class ModelStore:
    """Owns the catalog bucket (the catalog is its only writer) and the event of each change."""

    def __init__(self, kv: KeyValue, nc: Client, log) -> None:
        self.kv = kv
        self.nc = nc
        self.log = log

    async def entry(self, name: str) -> ModelEntry:
        """The model called `name` with its revision; NotFound when the catalog has none."""
        try:
            got = await self.kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            raise NotFound(f"model '{name}' is not in the catalog; `llmgw ctl models` shows what is") from None
        return _entry(msgspec.json.decode(got.value, type=CatalogRecord), got.revision)

    async def maybe(self, name: str) -> ModelEntry | None:
        """The model called `name`, or None."""
        try:
            return await self.entry(name)
        except NotFound:
            return None

    async def all(self) -> dict[str, ModelEntry]:
        """Every model by name."""
        return {name: _entry(r, rev) for name, (r, rev) in (await kv_scan(self.kv, CatalogRecord)).items()}

    async def others(self, name: str) -> dict[str, Model]:
        """Every model but `name`, by name: what a change to `name` is checked against."""
        return {n: e.model for n, e in (await self.all()).items() if n != name}

    async def write(
        self, model: Model, expected: int, by: str, action: str, declared_in: str = "", file: FileInfo | None = None
    ) -> ModelEntry:
        """Compare-and-set `model` over revision `expected` (0: must not exist), with what the
        mirror answered for its file (`file`, where known)."""
        name, by = model.name, by or "unknown"
        before = (await self.maybe(name)) if expected else None
        record = CatalogRecord(model=model, changed_by=by, changed_at=time.time(), declared_in=declared_in, file=file)
        if trace.get_current_span().is_recording():  # the scheduler's starts for it join its trace
            record.trace = inject().get("traceparent", "")
        stored = msgspec.json.encode(record)
        try:
            revision = await (
                self.kv.create(name, stored) if expected == 0 else self.kv.update(name, stored, last=expected)
            )
        except KeyWrongLastSequenceError:
            if expected == 0:
                raise Conflict(
                    f"model '{name}' already exists: give the new one another name (serve --name), change that "
                    "one (`llmgw ctl model` scale, context, replicas...), or remove it first "
                    f"(`llmgw ctl model remove {name}`)"
                ) from None
            raise Conflict(
                f"model '{name}' changed since revision {expected}: get it again and reapply your change"
            ) from None
        self.log.info("model changed", model=name, action=action, revision=revision, by=by)
        await self._audit(by, action, name, before.model if before else None, model)
        return ModelEntry(model=model, revision=revision, changed_by=by, declared_in=declared_in, file=file)

    async def _audit(self, who: str, action: str, name: str, before: Model | None, after: Model | None) -> None:
        """The change on the audit trail (the router's stream keeps it)."""
        await record_change(
            self.nc, AuditEntry(time=0, who=who, area="catalog", action=action, subject=name), before, after
        )

    async def delete(self, entry: ModelEntry, by: str = "") -> None:
        """Remove the model at exactly `entry`'s revision (`by`: who, for the audit trail)."""
        name = entry.model.name
        try:
            await self.kv.delete(name, last=entry.revision)
        except KeyWrongLastSequenceError:
            raise Conflict(f"model '{name}' changed while being removed: try again") from None
        self.log.info("model removed", model=name)
        await self._audit(by or "unknown", "remove", name, entry.model, None)


def _entry(record: CatalogRecord, revision: int) -> ModelEntry:
    return ModelEntry(
        model=record.model,
        revision=revision,
        changed_by=record.changed_by,
        declared_in=record.declared_in,
        file=record.file,
    )
