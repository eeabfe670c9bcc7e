"""Forwarding an admitted request: to its model's best replica, else another (twice at most),
else its fallbacks'; a whole answer passed on, named as the client asked, or the engine's stream
relayed. How each request went is handed, as one `Served` value, to the `finish` it came with."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import msgspec
from litestar.response import Response, Stream

from llmgw.bus import get_logger
from llmgw.proto import Model, ReplicaState
from llmgw.router.balance import Balancer
from llmgw.router.core import Usage, answer_of, engine_headers, relay_line
from llmgw.router.demand import DemandSignal
from llmgw.router.directory import Directory, Ready
from llmgw.router.errors import NoReadyReplica, UpstreamFailed
from llmgw.router.metrics import Metrics
from llmgw.router.oracle import PrefixOracle
from llmgw.router.outcome import Served, status_of
from llmgw.router.prepare import Prepared

__all__ = ["RETRIES", "Finish", "Job", "Proxy"]

RETRIES = 2
"""Other replicas of a model tried after the first refused or failed before answering."""

Finish = Callable[[Served], None]
"""Told once how a forwarded request went (a stream: when it ended)."""

_FAILED = (aiohttp.ClientError, TimeoutError)


class Job(msgspec.Struct, kw_only=True):
    """An admitted request on its way to a replica."""

    prepared: Prepared
    started: float
    """`time.perf_counter()` when it arrived."""
    headers: dict[str, str]
    """Sent back with the answer (the limits' `x-ratelimit-*`)."""
    measured: bool = False
    """Whether the asked-for model's replicas were ready when it was prepared (its prompt then
    was measured and checked against the context before admission)."""
    tokens: list[int] | None = None
    """The prompt's tokens from then, where they were needed."""


class Proxy:
    """Sends requests to replicas and their answers back; keeps, through the balancer, what each
    replica is doing."""

    def __init__(  # noqa: PLR0913 -- one collaborator each, wired by the service
        self,
        directory: Directory,
        oracle: PrefixOracle,
        demand: DemandSignal,
        balancer: Balancer,
        metrics: Metrics,
        client: aiohttp.ClientSession,
    ) -> None:
        self.directory, self.oracle, self.demand = directory, oracle, demand
        self.balancer, self.metrics, self.client = balancer, metrics, client
        self.log = get_logger("router")

    async def forward(self, job: Job, finish: Finish) -> Response:
        """The answer of the asked-for model or, where it has no replica that answers, of its
        fallbacks; 503 where none does. `finish` hears how it went, whatever happens."""
        primary = job.prepared.model
        models = [primary, *self.directory.fallbacks(primary)]
        tried = Served(status=503)
        try:
            for i, model in enumerate(models):
                answer, tried = await self._on_model(job, model, i == 0, finish, tried)
                if answer is not None:
                    return answer
                if i == 0 and len(models) > 1:
                    self.log.info("answering from a fallback", model=model.name, fallbacks=primary.fallbacks)
            names = " or its fallbacks" if len(models) > 1 else ""
            raise NoReadyReplica(
                f"The model '{primary.name}'{names} has no ready replica now; try again shortly "
                "(`llmgw ctl model list` shows why).",
                headers={"retry-after": "5"},
            )
        except BaseException as exc:
            finish(msgspec.structs.replace(tried, status=status_of(exc)))
            raise

    async def _on_model(
        self, job: Job, model: Model, primary: bool, finish: Finish, tried: Served
    ) -> tuple[Response | None, Served]:
        """One model's replicas, best first; the answer, or None and the last replica tried."""
        self.demand.tell(model, time.time())
        candidates, ready = self.directory.ready(model)
        if not candidates and primary and model.scaling.idle_timeout_s is not None and await self.demand.wake(model):
            candidates, ready = self.directory.ready(model)
        held = await self._held(job, model, ready, primary)
        exclude: set[str] = set()
        for attempt in range(1 + RETRIES):
            choice, how = self.balancer.pick(candidates, job.prepared.blocks, time.time(), exclude, held)
            if choice is None:
                break
            exclude.add(choice.id)
            self.metrics.picked(model.name, how, retry=attempt > 0)
            tried = Served(status=503, model=model.name, replica=choice.id, pool=f"priority {choice.priority}")
            answer = await self._send(job, ready[choice.id][0], tried, finish)
            if answer is not None:
                return answer, tried
        return None, tried

    async def _held(self, job: Job, model: Model, ready: Ready, primary: bool) -> Callable[[str], int] | None:
        """Where replicas publish KV events, how many of the prompt's leading blocks each holds
        (None: the balancer goes by its own index). The asked-for model's prompt was measured
        before admission, unless it had to wake: it is measured (and checked) now."""
        if primary and job.measured:
            tokens = job.tokens
        else:
            tokens = await self.oracle.measure(job.prepared, model, ready.values(), primary)
        if tokens is None or not any(r.kv_events for r, _ in ready.values()):
            return None
        return self.oracle.held(tokens)

    async def _send(self, job: Job, replica: ReplicaState, tried: Served, finish: Finish) -> Response | None:
        """One try on one replica; None when it refused or failed before the first byte."""
        checked = job.prepared.checked
        body = checked.body if tried.model == job.prepared.model.name else {**checked.body, "model": tried.model}
        self.balancer.started(replica.id)
        self.metrics.in_flight(tried.model, replica.id, +1)
        try:
            resp = await self.client.post(
                replica.url + job.prepared.path, data=msgspec.json.encode(body), headers=engine_headers(replica.api_key)
            )
        except _FAILED as exc:
            self._done(tried, ok=False)
            self.log.warning("replica refused, trying another", replica=replica.id, error=repr(exc))
            return None
        if resp.status in (502, 503, 504):
            resp.release()
            self._done(tried, ok=False)
            self.log.warning("replica failed before answering, trying another", replica=replica.id, status=resp.status)
            return None
        headers = {**job.headers, "x-llmgw-replica": replica.id}
        if not checked.streaming or resp.status != 200:
            return await self._whole(job, resp, tried, headers, finish)
        return Stream(
            self._relay(job, resp, tried, finish),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def _whole(  # noqa: PLR0913 -- the try's request, its answer, its replica, its headers, its end
        self, job: Job, resp: aiohttp.ClientResponse, tried: Served, headers: dict[str, str], finish: Finish
    ) -> Response | None:
        """A whole answer read and passed on; None where the replica failed mid-answer."""
        try:
            raw = await resp.read()
        except _FAILED as exc:
            self._done(tried, ok=False)
            self.log.warning("replica failed mid-answer, trying another", replica=tried.replica, error=repr(exc))
            return None
        finally:
            resp.release()
        self._done(tried, ok=resp.status < 500)
        usage = Usage()
        if resp.status == 200:
            raw, usage = answer_of(raw, job.prepared.checked.body["model"])
        self._ended(job, msgspec.structs.replace(tried, status=resp.status, usage=usage), finish)
        return Response(raw, status_code=resp.status, media_type="application/json", headers=headers)

    async def _relay(
        self, job: Job, resp: aiohttp.ClientResponse, tried: Served, finish: Finish
    ) -> AsyncIterator[bytes]:
        """The engine's SSE stream passed on, rewritten; one write per read from the engine (the
        events that arrived together leave together)."""
        name, include = job.prepared.checked.body["model"], job.prepared.checked.include_usage
        usage, ttft, status = Usage(), None, 499  # until it ends well: the client went away
        try:
            pending = b""
            async for piece in resp.content.iter_any():
                *lines, pending = (pending + piece).split(b"\n")
                out = []
                for line in lines:
                    event, usage, chunk = relay_line(line, name, include, usage)
                    if chunk and ttft is None:
                        ttft = time.perf_counter() - job.started
                    if event:
                        out.append(event)
                if out:
                    yield b"".join(out)
            if pending.strip():
                event, usage, _ = relay_line(pending, name, include, usage)
                yield event or b""
            status = 200
        except _FAILED as exc:
            status = 502
            err = UpstreamFailed(f"The replica failed mid-answer: {exc}")
            yield b"event: error\ndata: " + msgspec.json.encode(err.body()) + b"\n\n"
        finally:  # also when the client went away: its slot and its concurrency count are freed now
            if status == 200:
                resp.release()  # the connection goes back to the pool
            else:
                resp.close()
            self._done(tried, ok=status == 200)
            self._ended(job, msgspec.structs.replace(tried, status=status, usage=usage, ttft_s=ttft), finish)

    def _done(self, tried: Served, ok: bool) -> None:
        self.balancer.finished(tried.replica, ok, time.time())
        self.metrics.in_flight(tried.model, tried.replica, -1)

    def _ended(self, job: Job, served: Served, finish: Finish) -> None:
        """A replica answered: where it answered well it now holds the prompt's blocks."""
        if served.status == 200 and job.prepared.blocks:
            self.balancer.served(served.replica, job.prepared.blocks, served.usage.prompt, served.usage.cached)
        finish(served)
