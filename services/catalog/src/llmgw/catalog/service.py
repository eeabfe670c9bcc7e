"""The catalog service: models in the JetStream KV bucket, get/list/put/remove over NATS."""

from __future__ import annotations

import sys
import time

import msgspec
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import BusConfig, Conflict, Context, NotFound, kv_bucket, kv_keys, load_config, run
from llmgw.catalog.core import apply_change, check_model
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Empty,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPut,
    ModelRef,
    Subjects,
)

__all__ = ["Catalog", "CatalogConfig", "main"]


class CatalogConfig(BusConfig, kw_only=True):
    """Catalog settings."""

    history: int = 5
    """Revisions the KV bucket keeps per model."""


class Catalog:
    """Owns the catalog bucket: the only writer of it."""

    name = "catalog"
    version = "0.1.0"
    description = "models, profiles and scaling"

    def __init__(self, config: CatalogConfig) -> None:
        self.config = config
        self.kv: KeyValue | None = None
        self.ctx: Context | None = None

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.kv = await kv_bucket(ctx.js, BUCKETS["catalog"], history=self.config.history)
        await ctx.endpoint("model-put", Subjects.CATALOG_MODEL_PUT, ModelPut, self.put)
        await ctx.endpoint("model-get", Subjects.CATALOG_MODEL_GET, ModelRef, self.get)
        await ctx.endpoint("model-list", Subjects.CATALOG_MODEL_LIST, Empty, self.list)
        await ctx.endpoint("model-remove", Subjects.CATALOG_MODEL_REMOVE, ModelRef, self.remove)
        await ctx.endpoint("model-change", Subjects.CATALOG_MODEL_CHANGE, ModelChange, self.change)

    async def stop(self) -> None:
        pass

    def ready(self) -> bool:
        return self.kv is not None

    async def _entry(self, name: str) -> ModelEntry:
        try:
            got = await self.kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            raise NotFound(f"model '{name}' is not in the catalog; `llmgw ctl model list` shows what is") from None
        return _decode(got.value, got.revision)

    async def get(self, ref: ModelRef) -> ModelEntry:
        return await self._entry(ref.name)

    async def list(self, _: Empty) -> ModelList:
        entries = []
        for key in await kv_keys(self.kv):
            try:
                entries.append(await self._entry(key))
            except NotFound:
                continue  # removed between keys() and get()
        return ModelList(models=sorted(entries, key=lambda e: e.model.name))

    async def put(self, req: ModelPut) -> ModelEntry:
        check_model(req.model)
        expected = req.revision
        if expected is None:
            try:
                expected = (await self.kv.get(req.model.name)).revision
            except (KeyNotFoundError, KeyDeletedError):
                expected = 0
        return await self._write(req.model, expected, req.by)

    async def change(self, req: ModelChange) -> ModelEntry:
        entry = await self._entry(req.name)
        if req.revision is not None and req.revision != entry.revision:
            raise Conflict(f"model '{req.name}' is at revision {entry.revision}, not {req.revision}: get it again")
        return await self._write(apply_change(entry.model, req), entry.revision, req.by, req.action)

    async def _write(self, model: Model, expected: int, by: str, action: str = "put") -> ModelEntry:
        """Compare-and-set `model` over revision `expected` (0: must not exist), then publish the event."""
        name = model.name
        stored = msgspec.json.encode(CatalogRecord(model=model, changed_by=by or "unknown", changed_at=time.time()))
        try:
            revision = await (self.kv.create(name, stored) if expected == 0 else self.kv.update(name, stored, last=expected))
        except KeyWrongLastSequenceError:
            if expected == 0:
                raise Conflict(f"model '{name}' already exists: get it and pass its revision to change it") from None
            raise Conflict(
                f"model '{name}' changed since revision {expected}: get it again and reapply your change"
            ) from None
        await self.ctx.nc.publish(Subjects.model_event(name), stored)
        self.ctx.log.info("model changed", model=name, action=action, revision=revision, by=by)
        return ModelEntry(model=model, revision=revision, changed_by=by or "unknown")

    async def remove(self, ref: ModelRef) -> ModelEntry:
        entry = await self._entry(ref.name)
        try:
            await self.kv.delete(ref.name, last=entry.revision)
        except KeyWrongLastSequenceError:
            raise Conflict(f"model '{ref.name}' changed while being removed: try again") from None
        await self.ctx.nc.publish(Subjects.model_event(ref.name), b"")
        self.ctx.log.info("model removed", model=ref.name)
        return entry


def _decode(raw: bytes, revision: int) -> ModelEntry:
    stored = msgspec.json.decode(raw, type=CatalogRecord)
    return ModelEntry(model=stored.model, revision=revision, changed_by=stored.changed_by)


def main(argv: list[str] | None = None) -> int:
    """Run the catalog service."""
    config = load_config(CatalogConfig, argv)
    return run(Catalog(config), config)


if __name__ == "__main__":
    sys.exit(main())
