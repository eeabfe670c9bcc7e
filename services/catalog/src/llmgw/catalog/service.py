"""The catalog service: models in the JetStream KV bucket, changed over NATS with compare-and-set."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import msgspec
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import (
    BadRequest,
    BusConfig,
    BusError,
    Conflict,
    Context,
    KvTable,
    NotFound,
    gather,
    kv_bucket,
    kv_keys,
    load_config,
    request,
    run,
)
from llmgw.catalog.core import apply_change, check_catalog, check_model, files_to_purge
from llmgw.catalog.declared import load_declared
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Empty,
    FilePlace,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    PurgeReport,
    ReplicaState,
    Subjects,
    WeightsDelete,
    WeightsDeleted,
)

__all__ = ["Catalog", "CatalogConfig", "main"]


class CatalogConfig(BusConfig, kw_only=True):
    """Catalog settings."""

    history: int = 5
    """Revisions the KV bucket keeps per model."""
    declared: str = ""
    """A YAML file of models ({models: [...]}) written at start; they are changed only there."""
    purge_wait_s: float = 60.0
    """How long a purge waits for the model's replicas to stop before it deletes files."""
    purge_gather_s: float = 1.5
    """How long a purge waits for every agent to say what it deleted."""


class Catalog:
    """Owns the catalog bucket: the only writer of it."""

    name = "catalog"
    version = "0.1.0"
    description = "models, profiles and scaling"

    def __init__(self, config: CatalogConfig) -> None:
        self.config = config
        self.kv: KeyValue | None = None
        self.replicas: KvTable[ReplicaState] | None = None
        self.ctx: Context | None = None

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.kv = await kv_bucket(ctx.js, BUCKETS["catalog"], history=self.config.history)
        if self.config.declared:
            await self._write_declared(Path(self.config.declared))
        await ctx.endpoint("model-put", Subjects.CATALOG_MODEL_PUT, ModelPut, self.put)
        await ctx.endpoint("model-get", Subjects.CATALOG_MODEL_GET, ModelRef, self.get)
        await ctx.endpoint("model-list", Subjects.CATALOG_MODEL_LIST, Empty, self.list)
        await ctx.endpoint("model-remove", Subjects.CATALOG_MODEL_REMOVE, ModelRef, self.remove)
        await ctx.endpoint("model-change", Subjects.CATALOG_MODEL_CHANGE, ModelChange, self.change)
        await ctx.endpoint("model-purge", Subjects.CATALOG_MODEL_PURGE, ModelPurge, self.purge)
        self.replicas = await KvTable.open(ctx.js, BUCKETS["replicas"], ReplicaState)

    async def stop(self) -> None:
        if self.replicas:
            self.replicas.stop()

    def ready(self) -> bool:
        return self.kv is not None

    # -- reading --------------------------------------------------------------------------
    async def _entry(self, name: str) -> ModelEntry:
        try:
            got = await self.kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            raise NotFound(f"model '{name}' is not in the catalog; `llmgw ctl model list` shows what is") from None
        record = msgspec.json.decode(got.value, type=CatalogRecord)
        return ModelEntry(
            model=record.model, revision=got.revision, changed_by=record.changed_by, declared_in=record.declared_in
        )

    async def _maybe(self, name: str) -> ModelEntry | None:
        try:
            return await self._entry(name)
        except NotFound:
            return None

    async def _all(self) -> dict[str, ModelEntry]:
        entries = {}
        for key in await kv_keys(self.kv):
            try:
                entries[key] = await self._entry(key)
            except NotFound:
                continue  # removed between keys() and get()
        return entries

    async def get(self, ref: ModelRef) -> ModelEntry:
        return await self._entry(ref.name)

    async def list(self, _: Empty) -> ModelList:
        return ModelList(models=sorted((await self._all()).values(), key=lambda e: e.model.name))

    # -- changing -------------------------------------------------------------------------
    @staticmethod
    def _editable(entry: ModelEntry) -> None:
        if entry.declared_in:
            raise BadRequest(
                f"model '{entry.model.name}' is declared in {entry.declared_in}; "
                "change it there and restart the catalog"
            )

    async def put(self, req: ModelPut) -> ModelEntry:
        check_model(req.model)
        current = await self._maybe(req.model.name)  # read directly: the listing is for the others
        if current:
            self._editable(current)
        others = await self._all()
        check_catalog(req.model, {n: e.model for n, e in others.items() if n != req.model.name})
        expected = req.revision if req.revision is not None else (current.revision if current else 0)
        return await self._write(req.model, expected, req.by, "put")

    async def change(self, req: ModelChange) -> ModelEntry:
        entry = await self._entry(req.name)
        self._editable(entry)
        if req.revision is not None and req.revision != entry.revision:
            raise Conflict(f"model '{req.name}' is at revision {entry.revision}, not {req.revision}: get it again")
        changed = apply_change(entry.model, req)
        if req.action == "alias":
            others = {n: e.model for n, e in (await self._all()).items() if n != req.name}
            check_catalog(changed, others)
        return await self._write(changed, entry.revision, req.by, req.action)

    async def remove(self, ref: ModelRef) -> ModelEntry:
        entry = await self._entry(ref.name)
        self._editable(entry)
        leaning = sorted(n for n, e in (await self._all()).items() if n != ref.name and ref.name in e.model.fallbacks)
        if leaning:
            raise BadRequest(
                f"model '{ref.name}' is a fallback of {', '.join(leaning)}; remove it from their fallbacks first"
            )
        try:
            await self.kv.delete(ref.name, last=entry.revision)
        except KeyWrongLastSequenceError:
            raise Conflict(f"model '{ref.name}' changed while being removed: try again") from None
        await self.ctx.nc.publish(Subjects.model_event(ref.name), b"")
        self.ctx.log.info("model removed", model=ref.name)
        return entry

    async def purge(self, req: ModelPurge) -> PurgeReport:
        """Remove the model, wait for its replicas to stop, then delete its files where no other model needs them."""
        entry = await self.remove(ModelRef(name=req.name))
        report = PurgeReport(entry=entry)
        sources, report.kept = files_to_purge(entry.model, {n: e.model for n, e in (await self._all()).items()})
        if not sources:
            return report
        deadline = time.monotonic() + self.config.purge_wait_s
        while time.monotonic() < deadline and any(r.model == req.name for r in self.replicas.items.values()):
            await asyncio.sleep(0.2)
        ask = WeightsDelete(sources=sources)
        answers: list[WeightsDeleted | BusError] = await gather(
            self.ctx.nc, Subjects.AGENT_WEIGHTS_DELETE, ask, WeightsDeleted, self.config.purge_gather_s
        )
        try:
            answers.append(await request(self.ctx.nc, Subjects.MIRROR_FILE_DELETE, ask, WeightsDeleted))
        except BusError as exc:
            answers.append(exc)
        for answer in answers:
            if isinstance(answer, BusError):
                report.kept.extend(FilePlace(source=s, where="unknown", why=answer.message) for s in sources)
                continue
            report.deleted.extend(FilePlace(source=s, where=answer.where) for s in answer.deleted)
            report.kept.extend(answer.kept)
        self.ctx.log.info(
            "model purged",
            model=req.name,
            by=req.by or "unknown",
            deleted=[f"{d.where}:{d.source}" for d in report.deleted],
        )
        return report

    async def _write(self, model: Model, expected: int, by: str, action: str, declared_in: str = "") -> ModelEntry:
        """Compare-and-set `model` over revision `expected` (0: must not exist), then publish the event."""
        name, by = model.name, by or "unknown"
        stored = msgspec.json.encode(
            CatalogRecord(model=model, changed_by=by, changed_at=time.time(), declared_in=declared_in)
        )
        try:
            revision = await (
                self.kv.create(name, stored) if expected == 0 else self.kv.update(name, stored, last=expected)
            )
        except KeyWrongLastSequenceError:
            if expected == 0:
                raise Conflict(f"model '{name}' already exists: get it and pass its revision to change it") from None
            raise Conflict(
                f"model '{name}' changed since revision {expected}: get it again and reapply your change"
            ) from None
        await self.ctx.nc.publish(Subjects.model_event(name), stored)
        self.ctx.log.info("model changed", model=name, action=action, revision=revision, by=by)
        return ModelEntry(model=model, revision=revision, changed_by=by, declared_in=declared_in)

    async def _write_declared(self, path: Path) -> None:
        """The file is the truth for its models: written over what the bucket had, and dropped when gone from it."""
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise BadRequest(f"declared models file {path}: {exc.strerror}") from None
        declared = {m.name: m for m in load_declared(text, str(path))}
        entries = await self._all()
        known = {n: e.model for n, e in entries.items() if not e.declared_in} | declared
        for model in declared.values():
            check_catalog(model, {n: m for n, m in known.items() if n != model.name})
        for name, model in declared.items():
            current = entries.get(name)
            if current and (current.model, current.declared_in) == (model, str(path)):
                continue
            await self._write(model, current.revision if current else 0, f"declared in {path}", "declare", str(path))
        for name, entry in entries.items():
            if entry.declared_in == str(path) and name not in declared:
                await self.kv.delete(name, last=entry.revision)
                self.ctx.log.info("declared model removed", model=name, file=str(path))


def main(argv: list[str] | None = None) -> int:
    """Run the catalog service."""
    config = load_config(CatalogConfig, argv)
    return run(Catalog(config), config)


if __name__ == "__main__":
    sys.exit(main())
