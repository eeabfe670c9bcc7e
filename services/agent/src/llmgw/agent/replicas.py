"""The replicas this node runs: each one's cards, weights, port and engine, and what the agent
says of it (a ReplicaReport, published on every change)."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import time
from pathlib import Path

import httpx
import msgspec
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from llmgw.agent import adoption, usage
from llmgw.agent.cache import FetchError, WeightsCache
from llmgw.agent.core import EngineSetup, Launch, adapter_sources, check_profile, launch, redact, what_it_said
from llmgw.agent.mirrors import fetch_nearest
from llmgw.agent.node import NodeFacts
from llmgw.agent.room import Room
from llmgw.agent.supervisor import Child, ChildSpec, Left, StartFailed, Supervisor
from llmgw.bus import BadRequest, Context, EngineKeys, EngineSecretError, Internal
from llmgw.gguf import GGUFError, read_header
from llmgw.proto import GpuInfo, ReplicaReport, ReplicaSpec, ReplicaStart, ReplicaStop, agent

__all__ = ["Replicas", "Run"]

_tracer = trace.get_tracer("llmgw.agent")


class Run:
    """One replica on this node: what the scheduler asked (`spec`) and what this agent says of it
    (`report`)."""

    def __init__(self, spec: ReplicaSpec, source: str, adapters: list[str]) -> None:
        self.spec = spec
        self.source = source
        """The weights file it runs on."""
        self.adapters = adapters
        """The LoRA adapters' files its engine loads (`spec.adapters`' sources, in order)."""
        self.report = ReplicaReport(
            id=spec.id, model=spec.model, profile=spec.profile, node=spec.node, state="fetching", updated=time.time()
        )
        self.child: Child | None = None
        """Its engine, once it serves."""
        self.task: asyncio.Task | None = None

    @property
    def live(self) -> bool:
        """Whether it runs or is on its way to (not failed, not stopped)."""
        return self.report.state not in ("failed", "stopped")


class Replicas:
    """The replicas of this node, by id (failed ones too, until stopped)."""

    def __init__(
        self, facts: NodeFacts, supervisor: Supervisor, room: Room, weights: WeightsCache, keys: EngineKeys
    ) -> None:
        self.facts, self.supervisor, self.room, self.weights, self.keys = facts, supervisor, room, weights, keys
        self.config = facts.config
        self.runs: dict[str, Run] = {}
        self._ctx: Context | None = None

    def _key(self, run: Run) -> str:
        """The key its engine demands, worked out from this node's secret."""
        return self.keys.key(run.spec.node, run.spec.id)

    def bind(self, ctx: Context) -> None:
        """Publish and ask over `ctx` from now."""
        self._ctx = ctx

    def reports(self) -> list[ReplicaReport]:
        """What each replica here is now, with the memory each running engine uses measured now."""
        engines = [r for r in self.runs.values() if r.child is not None and r.live]
        on_cards = usage.card_mb_by_pid(self.facts.nvml) if any(r.spec.gpus for r in engines) else {}
        for r in engines:
            r.report = msgspec.structs.replace(r.report, measured_mb=usage.engine_memory_mb(r.child.pid, on_cards))
        return [r.report for r in self.runs.values()]

    def running(self) -> dict[str, list[str]]:
        """The live replicas here and the sources each runs on (its weights, its adapters)."""
        return {rid: [r.source, *r.adapters] for rid, r in self.runs.items() if r.live}

    async def start(self, req: ReplicaStart) -> ReplicaReport:
        """Start a replica (once, however often asked); its report says how it goes from there."""
        rid = req.replica.id
        if rid in self.runs:
            return self.runs[rid].report  # asked twice: never started twice
        if req.replica.node != self.facts.node:
            raise BadRequest(f"replica {rid} is for node '{req.replica.node}', this is '{self.facts.node}'")
        if req.profile.engine not in self.facts.engines.versions():
            raise BadRequest(f"replica {rid}: engine '{req.profile.engine}' is not installed on {self.facts.node}")
        try:  # replica.start may come from anyone on the bus: the profile's args and env are checked here
            check_profile(req.profile, self.config.engine_args_allowed)
        except ValueError as exc:
            raise BadRequest(f"replica {rid}: {exc}") from None
        try:
            adapters = adapter_sources(req.model, req.replica.adapters)
        except ValueError as exc:
            raise BadRequest(f"replica {rid}: {exc}") from None
        run = Run(req.replica, req.model.source, adapters)
        self.runs[rid] = run
        run.task = asyncio.create_task(self._run(run, req))
        await self._publish(run)
        return run.report

    async def stop(self, req: ReplicaStop) -> ReplicaReport:
        """Stop a replica (its engine ends gracefully); an unknown one is stopped already."""
        run = self.runs.get(req.id)
        if run is None:
            return ReplicaReport(id=req.id, model="unknown", profile="unknown", node=self.facts.node, state="stopped")
        await self._stop(run, req.reason or "asked to stop")
        return run.report

    async def stop_all(self, reason: str) -> None:
        """Stop every replica here."""
        await asyncio.gather(*(self._stop(r, reason) for r in list(self.runs.values())))

    async def _stop(self, run: Run, reason: str) -> None:
        run.report = msgspec.structs.replace(run.report, state="stopped", error=reason)
        await self.supervisor.stop(run.spec.id)
        if run.task and not run.task.done():
            run.task.cancel()
        self.room.release(run.spec.id)
        self.runs.pop(run.spec.id, None)
        await self._set(run, state="stopped")

    async def leave_all(self, reason: str) -> None:
        """Leave every ready engine running for the next agent to adopt; stop the others."""
        for run in list(self.runs.values()):
            if run.child is not None and run.report.state == "ready":
                self.supervisor.leave(run.spec.id)
            else:
                await self._stop(run, reason)

    async def adopt(self, left: Left) -> str:
        """Take over an engine a previous agent left, as it runs, if this agent can vouch for it
        (its note whole, its command line the one noted, its health check answered); else end
        it. Says which, and why."""
        try:
            engine = adoption.found(left.note)
        except ValueError as exc:
            await self.supervisor.end(left)
            return f"ended: {exc}"
        run = Run(engine.spec, engine.source, engine.adapters)
        try:
            secrets = [self._key(run)]
        except EngineSecretError as exc:  # noted for another node (this one was renamed): not ours to run
            await self.supervisor.end(left)
            return f"ended: {exc.message}"
        why = adoption.why_not(engine, left.cmdline, secrets) or await self._unhealthy(engine.url)
        if why:
            await self.supervisor.end(left)
            return f"ended: {why}"
        run.report = msgspec.structs.replace(run.report, state="ready", url=engine.url, kv_events=engine.kv_events)
        self.room.keep(run.spec.id, engine.port, engine.cards)
        spec = ChildSpec(
            name=run.spec.id,
            launch=Launch(argv=engine.argv, env={}),
            up=functools.partial(self._healthy, engine.url),
            timeout_s=0.0,
            what="engine",
            on_exit=functools.partial(self._exited, run),
            secrets=tuple(secrets),
            survives=True,
        )
        run.child = self.supervisor.adopt(spec, left)
        self.runs[run.spec.id] = run
        return "adopted"

    async def _unhealthy(self, url: str, tries: int = 3) -> str:
        """Why an adopted engine is not taken as it is: it does not answer its health check."""
        for _ in range(tries):
            if await self._healthy(url):
                return ""
            await asyncio.sleep(0.5)
        return f"it does not answer its health check at {url}"

    def _found(self, run: Run, setup: EngineSetup, how: Launch) -> adoption.Found:
        """What an engine's note says of it (for the next agent, should this one die)."""
        port, events = setup.port, setup.kv_events_port
        return adoption.Found(
            spec=run.spec,
            source=run.source,
            adapters=run.adapters,
            url=f"http://{setup.host}:{port}",
            kv_events=f"tcp://{setup.host}:{events}" if events else "",
            port=port,
            cards=[g.uuid for g in setup.cards],
            argv=adoption.noted_argv(how, [setup.api_key]),
        )

    async def _run(self, run: Run, req: ReplicaStart) -> None:
        """Fetch, start and watch the replica's engine; a span of its own in the trace of whoever
        asked (the scheduler's placing, and the operator's change that made it)."""
        attributes = {"llmgw.model": req.model.name, "llmgw.replica": run.spec.id, "llmgw.engine": req.profile.engine}
        with _tracer.start_as_current_span(f"start engine {run.spec.id}", attributes=attributes) as span:
            await self._launch(run, req)
            if run.report.state == "failed":
                span.set_status(Status(StatusCode.ERROR, run.report.error[:200]))

    async def _launch(self, run: Run, req: ReplicaStart) -> None:
        rid = run.spec.id
        log = self._ctx.log.bind(replica=rid, model=req.model.name)
        try:
            cards = self.room.take_cards(rid, run.spec.gpus, req.profile)
            weights = await self._fetch(req.model.source)
            adapters = [await self._fetch(source) for source in run.adapters]
            setup = await self._setup(run, req, cards, (weights, adapters))
            url = f"http://{setup.host}:{setup.port}"
            events = f"tcp://{setup.host}:{setup.kv_events_port}" if setup.kv_events_port else ""
            await self._set(run, state="starting", url=url, kv_events=events)
            how = launch(setup)
            log.info(
                "starting engine", command=[redact(c, [setup.api_key]) for c in how.argv], cards=self.room.cards[rid]
            )
            spec = ChildSpec(
                name=rid,
                launch=how,
                up=functools.partial(self._healthy, url),
                timeout_s=req.profile.startup_timeout_s,
                what="engine",
                on_exit=functools.partial(self._exited, run),
                note=adoption.engine_note(self._found(run, setup, how)),
                survives=True,  # serves on if this agent dies; the next one adopts it
                secrets=(setup.api_key,),
            )
            run.child = await self.supervisor.start(spec)
            await self._set(run, state="ready")
            log.info("replica ready", url=url)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.supervisor.stop(rid)  # an engine that serves but could not be said ready
            if run.live:  # not stopped meanwhile
                log.warning("replica failed", error=redact(str(exc), [self._key(run)]))
                await self._fail(run, str(exc), exc.tail if isinstance(exc, StartFailed) else [])

    async def _setup(
        self, run: Run, req: ReplicaStart, cards: list[GpuInfo], files: tuple[Path, list[Path]]
    ) -> EngineSetup:
        """Where and how its engine runs (`files`: its weights and its adapters in this node's
        cache): a port of its own (and one for vLLM's KV events)."""
        weights, adapters = files
        rid, vllm = run.spec.id, req.profile.engine == "vllm"
        port = self.room.take_port(rid)
        rpc = [w.endpoint for w in run.spec.workers]
        if not all(rpc):
            raise Internal("a worker of this replica has no endpoint: the scheduler starts workers first")
        return EngineSetup(
            binary=(shutil.which(self.config.vllm) or self.config.vllm) if vllm else self.facts.llamacpp.server,
            weights=weights,
            adapters=dict(zip(run.spec.adapters, adapters, strict=True)),
            port=port,
            model=req.model,
            profile=req.profile,
            api_key=self._key(run),
            node_cpus=os.cpu_count() or 1,
            cards=cards,
            host=self.config.address,
            kv_events_port=self.room.take_port(rid, besides=port) if vllm and req.profile.kv_events else 0,
            rpc=rpc,
            layers=self._layers(weights) if rpc else 0,
            allowed=frozenset(self.config.engine_args_allowed),
        )

    @staticmethod
    def _layers(path: Path) -> int:
        try:
            return read_header(path).block_count
        except (GGUFError, OSError) as exc:
            raise Internal(f"cannot read the layer count of {path.name}: {exc}") from None

    async def _fetch(self, source: str) -> Path:
        """The model file in this node's cache: fetched once from the nearest mirror with a
        verified copy (`llmgw.agent.mirrors`), checked against its hash."""
        try:
            return await fetch_nearest(
                self._ctx.nc, self.weights, source, self.config.site, self.config.mirror_window_s
            )
        except FetchError as exc:
            raise Internal(str(exc)) from None

    async def _healthy(self, url: str) -> bool:
        try:
            return (await self.weights.http.get(f"{url}/health", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _exited(self, run: Run, child: Child, code: int) -> None:
        await self._fail(run, f"engine exited with status {code}", list(child.tail))

    async def _fail(self, run: Run, error: str, tail: list[str]) -> None:
        """Failed: its room freed; its report says why with what the engine printed that tells
        (the model's reason carries it) and where its log stays on this node."""
        self.room.release(run.spec.id)
        log = f"{self.supervisor.logs / run.spec.id}.log on node {self.facts.node}" if tail else ""
        said = redact(what_it_said(error, tail, log), [self._key(run)])
        await self._set(run, state="failed", error=said, log_tail=tail)

    async def _set(self, run: Run, **changes) -> None:
        run.report = msgspec.structs.replace(run.report, updated=time.time(), **changes)
        await self._publish(run)

    async def _publish(self, run: Run) -> None:
        await self._ctx.nc.publish(
            agent.REPLICA_CHANGED.subject(run.spec.node, run.spec.id), msgspec.json.encode(run.report)
        )
