"""The catalog service: models in the JetStream KV bucket, changed over NATS with compare-and-set."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import msgspec

from llmgw.bus import (
    ADMIN_PORTS,
    BadRequest,
    BusConfig,
    BusError,
    Context,
    KvTable,
    NotFound,
    call,
    call_all,
    entry_point,
    kv_bucket,
    kv_keys,
)
from llmgw.catalog.core import (
    check_catalog,
    check_editable,
    check_file,
    check_model,
    check_removable,
    files_to_purge,
    is_pinned,
    tally_purge,
)
from llmgw.catalog.declared import declared_changes, load_declared
from llmgw.catalog.edits import apply_change, check_resources
from llmgw.catalog.hub_ways import hub_plans
from llmgw.catalog.serve import check_context, check_serve, choose_ways, plan_for_cards
from llmgw.catalog.served import served_model
from llmgw.catalog.store import ModelStore
from llmgw.modelplan import FileFacts, node_facts
from llmgw.proto import (
    BUCKETS,
    Empty,
    FileInfo,
    FileRef,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    NodeList,
    Page,
    PageFill,
    PurgeReport,
    ReplicaState,
    WeightsDelete,
    WeightsDeleted,
    agent,
    catalog,
    mirror,
    page_start,
    scheduler,
)
from llmgw.proto.catalog import Adapter, ServeModel, ServePlan, ServePlanAsk, SetAdapters, SetAliases, SetResources
from llmgw.proto.hub import HubSearch, HubWays
from llmgw.proto.mirror import AdapterCheck

__all__ = ["Catalog", "CatalogConfig", "main"]


class CatalogConfig(BusConfig, kw_only=True):
    """Catalog settings."""

    admin_port: int = ADMIN_PORTS["catalog"]

    history: int = 5
    """Revisions the KV bucket keeps per model."""
    declared: str = ""
    """A YAML file of models ({models: [...]}) written at start; they are changed only there."""
    purge_wait_s: float = 60.0
    """How long a purge waits for the model's replicas to stop before it deletes files."""
    purge_gather_s: float = 1.5
    """How long a purge waits for every agent to say what it deleted."""
    engine_args_allowed: list[str] = msgspec.field(default_factory=list)
    """Engine flags and environment variables let into profiles besides llmgw.modelplan's
    allow-list: those some nodes opted into (their agents' `engine_args_allowed`). Only those
    agents start such a profile, so it names them in its node_selector; the catalog does not
    check that (it cannot know each node's opt-in)."""
    file_check_s: float = 3.0
    """How long a put waits for the mirror to say whether the model's file reads; past it (or
    with no mirror) the model is accepted unchecked, with a warning."""


class Catalog:
    """Serves the catalog's endpoints over its store (the bucket) and the rules of its core."""

    name = "catalog"
    version = "0.1.0"
    description = "models, profiles and scaling"

    def __init__(self, config: CatalogConfig) -> None:
        self.config = config
        self.store: ModelStore | None = None
        self.replicas: KvTable[ReplicaState] | None = None
        self.ctx: Context | None = None

    async def start(self, ctx: Context) -> None:
        """Open the bucket, write the declared models, then answer."""
        self.ctx = ctx
        kv = await kv_bucket(ctx.js, BUCKETS["catalog"], history=self.config.history)
        self.store = ModelStore(kv, ctx.nc, ctx.log)
        if self.config.declared:
            await self._write_declared(Path(self.config.declared))
        self.replicas = await KvTable.open(ctx.js, BUCKETS["replicas"], ReplicaState)
        await ctx.serve(catalog.MODEL_PUT, self.put)
        await ctx.serve(catalog.MODEL_GET, self.get)
        await ctx.serve(catalog.MODEL_LIST, self.list)
        await ctx.serve(catalog.MODEL_REMOVE, self.remove)
        await ctx.serve(catalog.MODEL_CHANGE, self.change)
        await ctx.serve(catalog.MODEL_PURGE, self.purge)
        await ctx.serve(catalog.SERVE_PLAN, self.serve_plan)
        await ctx.serve(catalog.SERVE, self.serve)
        await ctx.serve(catalog.HUB_SEARCH, self.hub_search)

    async def stop(self) -> None:
        """Stop watching the replicas."""
        if self.replicas:
            self.replicas.stop()

    def ready(self) -> bool:
        """Ready once the bucket is open."""
        return self.store is not None

    async def get(self, ref: ModelRef) -> ModelEntry:
        """One model with its revision."""
        return await self.store.entry(ref.name)

    async def list(self, ask: Page) -> ModelList:
        """Every model, by name (a page of them: only its models are read from the bucket)."""
        names = sorted(await kv_keys(self.store.kv))
        fill = PageFill(ask, lambda e: (e.model.name,), "the model list")
        for name in names[page_start(names, ask, lambda n: (n,), "the model list") :]:
            try:
                entry = await self.store.maybe(name)  # None: deleted since the listing
            except msgspec.DecodeError as exc:  # left out, as every read of the whole bucket does
                self.ctx.log.warning(
                    "entry left out: it does not decode", bucket=BUCKETS["catalog"], key=name, error=str(exc)
                )
                continue
            if entry is not None and not fill.add(entry):
                models, after = fill.page(more=True)
                return ModelList(models=models, next=after)
        return ModelList(models=fill.items)

    async def put(self, req: ModelPut, file: FileInfo | None = None) -> ModelEntry:
        """Create or replace a model, checked alone and against the rest of the catalog (`file`:
        what the mirror answered for its file, where the caller asked already)."""
        check_model(req.model, self.config.engine_args_allowed)
        current = await self.store.maybe(req.model.name)
        if current:
            check_editable(current)
        check_catalog(req.model, await self.store.others(req.model.name))
        file = file or await self._check_file(req.model)
        await self._check_adapters(req.model, req.model.adapters)
        expected = req.revision if req.revision is not None else (current.revision if current else 0)
        return await self.store.write(req.model, expected, req.by, "put", file=file)

    async def _check_file(self, model: Model) -> FileInfo | None:
        """The mirror reads the model's file header: one that does not read is refused now. A source
        pinned to a commit ('OWNER/REPO@COMMIT/FILE') must be on the mirror and verified, else it is
        refused with what the mirror holds of that repo. A file placed by hand ('OWNER/REPO/FILE')
        not on the mirror yet is accepted (it may be put there later; the agent's fetch says so). What
        the mirror answered, None where it did not."""
        ask = FileRef(source=model.source, digest=False)
        pinned = is_pinned(model.source)
        try:
            info = await call(self.ctx.nc, mirror.FILE_STAT, ask, timeout=self.config.file_check_s)
        except NotFound as exc:
            if pinned:
                raise BadRequest(f"model '{model.name}': {exc.message}") from None
            return None
        except BusError as exc:
            if pinned:
                raise BadRequest(
                    f"model '{model.name}': the mirror did not answer ({exc.message}); a pinned source is "
                    "checked before it is accepted: start the mirror and try again"
                ) from None
            self.ctx.log.warning("model file not checked", model=model.name, source=model.source, error=exc.message)
            return None
        check_file(model, info)
        return info

    async def _check_adapters(self, model: Model, adapters: list[Adapter]) -> None:
        """The mirror reads each adapter's header beside the model's weights': one not on the
        mirror, not an adapter, or made for other weights is refused, saying which and why."""
        for a in adapters:
            ask = AdapterCheck(source=a.source, base=model.source)
            try:
                await call(self.ctx.nc, mirror.ADAPTER_CHECK, ask, timeout=self.config.file_check_s * 4)
            except NotFound as exc:
                raise BadRequest(
                    f"model '{model.name}' adapter '{a.name}': {exc.message}; the mirror holds an adapter before it "
                    "is attached (`llmgw ctl mirror add OWNER/REPO`)"
                ) from None
            except BadRequest as exc:
                raise BadRequest(f"model '{model.name}' adapter '{a.name}': {exc.message}") from None
            except BusError as exc:
                raise BadRequest(
                    f"model '{model.name}' adapter '{a.name}': the mirror did not answer ({exc.message}); an adapter "
                    "is checked against the weights before it is attached: start the mirror and try again"
                ) from None

    async def serve_plan(self, ask: ServePlanAsk) -> ServePlan:
        """Every way a mirrored file runs on the fleet's nodes now, best first."""
        return (await self._plan(ask))[0]

    async def hub_search(self, ask: HubSearch) -> HubWays:
        """Models on the Hub with their GGUF files (the mirror reads their headers) and the ways
        each would run on the fleet now (`hub_plans`); without a scheduler, the files alone."""
        found = await call(self.ctx.nc, mirror.HUB_SEARCH, ask)
        try:
            nodes = [node_facts(n) for n in (await self._nodes()).nodes]
        except BadRequest:
            nodes = []
        return HubWays(found=found, plans=hub_plans(found, nodes), nodes=len(nodes))

    async def serve(self, req: ServeModel) -> ModelEntry:
        """Put a mirrored file into service the way asked, under the rule that makes the CPU a
        choice made on purpose; written as a put of a new model (the catalog untouched on refusal)."""
        ask = ServePlanAsk(source=req.source, context=req.context, cores=req.cores, slots=req.slots, judge=req.judge)
        plan, cards, info = await self._plan(ask, gpus=req.gpus)
        card, cpu = choose_ways(plan, req, cards)
        model = served_model(req, plan, card, cpu)
        if info.facts is not None and info.facts.embedding:
            model = msgspec.structs.replace(model, kind="embedding")
        warnings = list(plan.warnings)
        for way in (w for w in (card, cpu) if w):
            # a judge writes a few tokens: the CPU's pace at writing does not hold it back
            warnings += check_serve(way, plan, req.cpu_anyway or req.judge, alone=card is None)
        entry = await self.put(ModelPut(model=model, revision=0, by=req.by), file=info)
        for way in (w for w in (card, cpu) if w):
            self.ctx.log.info(
                "model served",
                model=model.name,
                way=way.kind,
                cards=way.cards,
                node=way.node,
                tokens_per_s=way.tokens_per_s,
                memory_mb=way.memory_mb,
                cpu_anyway=req.cpu_anyway,
            )
        return msgspec.structs.replace(entry, warnings=warnings)

    async def _plan(self, ask: ServePlanAsk, gpus: int = 0) -> tuple[ServePlan, int, FileInfo]:
        """The plan of `ask` from the mirror's file (verified, with what its header says) and the
        scheduler's nodes (with `gpus`: its context fitted to that many cards), how many cards the
        fleet has, and what the mirror answered for the file."""
        if not ask.source.endswith(".gguf"):
            raise BadRequest(f"{ask.source} is not a .gguf file: serve runs GGUF files on llama.cpp")
        try:
            info = await call(self.ctx.nc, mirror.FILE_STAT, FileRef(source=ask.source, digest=False))
        except NotFound as exc:
            raise BadRequest(f"{exc.message}; `llmgw ctl mirror add OWNER/REPO` fetches it") from None
        except BusError as exc:
            raise BadRequest(f"the mirror did not answer ({exc.message}): start it and ask again") from None
        if not info.verified:
            raise BadRequest(
                f"the mirror has not verified {ask.source}: only a file checked against its published hash is "
                "served; `llmgw ctl mirror show` says how its fetch is doing"
            )
        if info.header_error:
            raise BadRequest(f"{ask.source}: its file {info.header_error}; serve a GGUF model")
        if info.facts is None:
            raise BadRequest(
                f"the mirror did not say what {ask.source} holds (a part of a split model after the first, or one "
                "with a part missing): serve its first part once every part is on the mirror"
            )
        listed = await self._nodes()
        nodes = [node_facts(n) for n in listed.nodes]
        plan = plan_for_cards(ask, _file_facts(ask.source, info), info.facts.trained_context, nodes, gpus)
        return plan, sum(len(n.gpus) for n in listed.nodes), info

    async def _nodes(self) -> NodeList:
        try:
            return await call(self.ctx.nc, scheduler.NODE_LIST, Empty())
        except BusError as exc:
            raise BadRequest(f"the scheduler did not answer ({exc.message}): start it and ask again") from None

    async def _context_warnings(self, entry: ModelEntry, changed: Model) -> list[str]:
        """A new context held to the serve plan's rule (`check_context`), where the file's header
        was read; what the plan warns of."""
        info = entry.file
        if changed.context == entry.model.context or info is None or info.facts is None:
            return []
        nodes = [node_facts(n) for n in (await self._nodes()).nodes]
        return check_context(changed, _file_facts(changed.source, info), info.facts.trained_context, nodes)

    async def change(self, req: ModelChange) -> ModelEntry:
        """Apply an operator's change (the core says what it makes of the model)."""
        entry = await self.store.entry(req.name)
        check_editable(entry, req.revision)
        changed = apply_change(entry.model, req, self.config.engine_args_allowed)
        if isinstance(req, SetAliases):
            check_catalog(changed, await self.store.others(req.name))
        if isinstance(req, SetResources):
            check_resources(req, [node_facts(n) for n in (await self._nodes()).nodes])
        if isinstance(req, SetAdapters):
            await self._check_adapters(changed, req.add)
        warnings = await self._context_warnings(entry, changed)
        action = type(req).__struct_config__.tag
        file = entry.file if changed.source == entry.model.source else None
        written = await self.store.write(changed, entry.revision, req.by, action, file=file)
        return msgspec.structs.replace(written, warnings=warnings) if warnings else written

    async def remove(self, ref: ModelRef) -> ModelEntry:
        """Remove a model no other falls back to (at `ref.revision`, if given); its replicas stop,
        its files stay."""
        entry = await self.store.entry(ref.name)
        check_editable(entry, ref.revision)
        check_removable(ref.name, await self.store.others(ref.name))
        await self.store.delete(entry, ref.by)
        return entry

    async def purge(self, req: ModelPurge) -> PurgeReport:
        """Remove the model, wait for its replicas to stop, then delete its files where no other model needs them."""
        entry = await self.remove(ModelRef(name=req.name, revision=req.revision, by=req.by))
        sources, kept = files_to_purge(entry.model, await self.store.others(req.name))
        if not sources:
            return tally_purge(entry, sources, kept, [])
        deadline = time.monotonic() + self.config.purge_wait_s
        while time.monotonic() < deadline and any(r.model == req.name for r in self.replicas.items.values()):
            await asyncio.sleep(0.2)
        ask = WeightsDelete(sources=sources)
        answers: list[WeightsDeleted | BusError] = await call_all(
            self.ctx.nc, agent.WEIGHTS_DELETE, ask, window_s=self.config.purge_gather_s
        )
        try:
            answers.append(await call(self.ctx.nc, mirror.FILE_DELETE, ask))
        except BusError as exc:
            answers.append(exc)
        report = tally_purge(entry, sources, kept, answers)
        self.ctx.log.info(
            "model purged",
            model=req.name,
            by=req.by or "unknown",
            deleted=[f"{d.where}:{d.source}" for d in report.deleted],
        )
        return report

    async def _write_declared(self, path: Path) -> None:
        """The file is the truth for its models: written over what the bucket had, and dropped when gone from it."""
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise BadRequest(f"declared models file {path}: {exc.strerror}") from None
        writes, gone = declared_changes(
            load_declared(text, str(path), self.config.engine_args_allowed), await self.store.all(), str(path)
        )
        for model, revision in writes:
            await self.store.write(model, revision, f"declared in {path}", "declare", str(path))
        for entry in gone:
            await self.store.delete(entry, f"declared in {path}")


def _file_facts(source: str, info: FileInfo) -> FileFacts:
    """What the plan reckons with of a file, from what the mirror read of its header."""
    assert info.facts is not None
    name = source.rsplit("/", 1)[-1]
    return FileFacts(name=name, format="gguf", quant=info.facts.quant, shape=info.facts.shape)


main = entry_point(Catalog, CatalogConfig)
"""Run the catalog until SIGTERM or SIGINT (`llmgw service catalog`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())
