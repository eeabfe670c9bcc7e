"""Forwarding an admitted request: to its model's best replica, else another (twice at most),
else its fallbacks'; a whole answer passed on, named as the client asked, or the engine's stream
relayed (`relay.py`). How each request went is handed, as one `Served` value, to the `finish` it
came with."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec

from llmgw.bus import get_logger
from llmgw.proto import Model, ReplicaState
from llmgw.router.errors import (
    ApiError,
    ContextTooLong,
    ModelStopped,
    NoReadyReplica,
    NotServed,
    UpstreamFailed,
    described,
)
from llmgw.router.metrics import Metrics
from llmgw.router.providers.pool import Pool
from llmgw.router.providers.store import Outside
from llmgw.router.request.adapters import engine_body
from llmgw.router.request.core import Prepared, Usage, answer_of, input_too_long, reservation
from llmgw.router.request.measure import measure
from llmgw.router.request.outcome import Served, ended_by
from llmgw.router.request.relay import FAILED, Answer, Finish, Relay, Try
from llmgw.router.routing.balance import text_blocks
from llmgw.router.routing.demand import DemandSignal
from llmgw.router.routing.directory import Directory, Ready
from llmgw.router.routing.health import Health, unless_out
from llmgw.router.routing.oracle import PrefixOracle
from llmgw.router.routing.upstream import EngineAnswer, Upstream

__all__ = ["RETRIES", "Proxy"]

RETRIES = 2
"""Other replicas of a model tried after the first refused or failed before answering."""
OUT_GRACE_S = 3.0
"""How long a request whose replicas all failed waits on one out of rotation that nothing is
replacing yet (its agent reports a dead engine, and starts it again, well within this)."""


class Proxy:
    """Sends requests to replicas and their answers back; keeps, through the balancer, what each
    replica is doing (and, through `health`, which are out of rotation)."""

    def __init__(
        self,
        directory: Directory,
        oracle: PrefixOracle,
        demand: DemandSignal,
        health: Health,
        metrics: Metrics,
        upstream: Upstream,
    ) -> None:
        self.directory, self.oracle, self.demand = directory, oracle, demand
        self.health, self.metrics, self.upstream = health, metrics, upstream
        self.balancer = health.balancer
        self.log = get_logger("router")
        self.outside: Callable[[str], Outside | None] = lambda _: None
        """The outside provider that answers a model, if any (the router's providers, once wired)."""

    async def forward(self, prepared: Prepared, finish: Finish) -> Answer | Relay:
        """The answer of the asked-for model or, where it has no replica that answers, of its
        fallbacks; 503 where none does. `finish` hears how it went, whatever happens."""
        primary = prepared.model
        # an adapter is its model's alone: no fallback or outside provider has it
        models = [primary, *self.directory.fallbacks(primary)] if not prepared.adapter else [primary]
        tried = Served(status=503)
        outside, refused = None, None
        try:
            outside = self.outside(primary.name) if not prepared.adapter else None
            if outside is not None and outside.provider.use == "only":
                try:
                    return (await self._on_provider(prepared, outside, finish))[0]
                except NoReadyReplica as exc:  # its every key refused or spent: its own replicas, if any
                    refused, outside = exc, None
            for i, model in enumerate(models):
                answer, tried = await self._on_model(prepared, model, i == 0, finish, tried, wake=outside is None)
                if answer is None and i == 0 and model.stopped is None and outside is None:  # nothing coming
                    answer, tried = await self._on_replacement(prepared, model, finish, tried)
                if answer is None and i == 0 and outside is not None:  # its own replicas not ready: outside
                    try:
                        answer, tried = await self._on_provider(prepared, outside, finish)
                    except NoReadyReplica as exc:  # its keys out: the model's fallbacks, then this said
                        refused = exc
                if answer is not None:
                    return answer
                if i == 0 and len(models) > 1:
                    self.log.info("answering from a fallback", model=model.name, fallbacks=primary.fallbacks)
            if refused is not None:
                raise refused
            raise _unanswered(prepared, len(models) > 1)
        except BaseException as exc:
            finish(ended_by(tried, exc))
            raise

    async def _on_model(
        self, prepared: Prepared, model: Model, primary: bool, finish: Finish, tried: Served, wake: bool = True
    ) -> tuple[Answer | Relay | None, Served]:
        """One model's replicas, best first; the answer, or None and the last replica tried.
        `wake`: where the asked-for model has none ready, wait for one coming (or waking)."""
        self.demand.tell(model, time.time())
        adapter = prepared.adapter if primary else ""
        candidates, ready = self.directory.ready(model, adapter)
        if not candidates and primary and wake and await self.demand.ready_soon(model):
            candidates, ready = self.directory.ready(model, adapter)
        if primary and prepared.measured:  # measured before admission: nothing to wait for
            held = self._held_of(prepared.tokens, ready, prepared.size)
        else:
            tokens = await measure(self.oracle, prepared, model, ready.values(), primary)
            held = self._held_of(tokens, ready, prepared.size)
        exclude: set[str] = set()
        for attempt in range(1 + RETRIES):
            choice, how = self.balancer.pick(candidates, prepared.blocks, time.time(), exclude, held, prepared.size)
            if choice is None:
                break
            exclude.add(choice.id)
            self.metrics.picked(model.name, how, retry=attempt > 0)
            tried = Served(status=503, model=model.name, replica=choice.id, pool=f"priority {choice.priority}")
            answer = await self._send(Try(self.health, self.metrics, prepared, tried, finish), ready[choice.id][0])
            if answer is not None:
                return answer, tried
        return None, tried

    async def _on_provider(self, prepared: Prepared, outside: Outside, finish: Finish) -> tuple[Answer | Relay, Served]:
        """The request sent to its outside provider with the key least used that has room for it,
        another key only where one is refused (429: cooled as long as the provider says; 401,
        403: a key revoked); 503 naming the provider where no key has room, or where the provider
        failed before answering (not the key's fault: not asked again with another)."""
        provider, pool = outside.provider, outside.pool
        tokens = reservation(prepared)
        body = msgspec.json.encode({**prepared.body, "model": outside.remote})
        base = urlsplit(provider.base_url)
        path = base.path.rstrip("/") + prepared.path.removeprefix("/v1")
        failed = ""
        for _ in provider.keys:
            key = pool.take(tokens, time.time())
            if key is None:
                break
            tried = Served(status=503, model=prepared.model.name, replica=f"provider:{provider.name}", pool=key)
            one = Try(self.health, self.metrics, prepared, tried, _counted(finish, pool, key, tokens))
            headers = {"authorization": f"Bearer {outside.secrets[key]}", "content-type": "application/json"}
            answer: Answer | Relay | str = ""
            try:
                request = (f"{base.scheme}://{base.netloc}", path, body, headers)
                answer = await self._send_outside(one, request, outside, key)
            finally:
                if isinstance(answer, str):  # no answer (or the client left): nothing spent, no word on it
                    one.end(ok=None)
                    pool.spent(key, tokens, 0, time.time())
            if not isinstance(answer, str):
                return answer, tried
            if failed := answer:
                break
        wait = max(1, math.ceil(pool.soonest(time.time())))
        why = (
            f"failed before answering ({failed})"
            if failed
            else "has every key cooling down or at its limit now (`llmgw ctl provider list` shows which)"
        )
        raise NoReadyReplica(
            f"Outside provider '{provider.name}' {why}; try again in {wait} s.", headers={"retry-after": str(wait)}
        )

    async def _send_outside(
        self, one: Try, request: tuple[str, str, bytes, dict[str, str]], outside: Outside, key: str
    ) -> Answer | Relay | str:
        """One try on the provider with one key: its answer; or why it failed before answering (a
        stream's first byte within the provider's `timeout_s`); or "" where it refused the key."""
        origin, path, body, headers = request
        read_s = outside.provider.timeout_s if one.prepared.streaming else None  # a whole answer: whole first
        try:
            resp = await self.upstream.post(origin, path, body, headers, read_s=read_s)
        except FAILED as exc:
            self.log.warning("outside provider failed", replica=one.tried.replica, error=described(exc))
            late = f"no first byte within {outside.provider.timeout_s:g} s"
            return late if isinstance(exc, TimeoutError) else described(exc)
        if resp.status in (401, 403, 429, 502, 503, 504):
            resp.release()
            if resp.status not in (401, 403, 429):
                return f"it answered {resp.status}"
            outside.pool.cool(key, resp.status, _seconds(resp.headers.get("retry-after")), time.time())
            self.log.warning("outside provider refused a key", replica=one.tried.replica, key=key, status=resp.status)
            return ""
        headers_out = {"x-llmgw-replica": one.tried.replica}
        if one.prepared.streaming and resp.status == 200:
            return Relay(one, resp, headers_out)
        if resp.status == 404:  # it knows the model by another name now: the provider's settings, not the client's
            resp.release()
            one.end(ok=None, served=msgspec.structs.replace(one.tried, status=502))
            provider, remote = outside.provider.name, outside.remote
            failed = UpstreamFailed(
                f"Outside provider '{provider}' does not know model '{remote}' (it answered 404): an admin "
                f"gives its name there now with `llmgw ctl provider put {provider} --model ...`."
            )
            return Answer(502, msgspec.json.encode(failed.body()), headers_out)
        return await self._whole(one, resp, headers_out) or "it failed mid-answer"

    async def _on_replacement(
        self, prepared: Prepared, model: Model, finish: Finish, tried: Served
    ) -> tuple[Answer | Relay | None, Served]:
        """No replica of the asked-for model answered (each tried failed, or none was in
        rotation). Where none is in rotation now, and one is on its way (its engine died and is
        being started again) or, for `OUT_GRACE_S`, out of rotation or being probed (its agent
        has yet to report it, or its replacement to pass its first probe), the request waits
        for it, `replace_wait_s` at most in all, trying what is in rotation whenever the replicas
        change and every quarter second besides; else None at once (the client is told 503)."""
        if self._in_rotation(model):
            return None, tried
        now = time.monotonic()
        deadline, grace = now + self.demand.replace_wait_s, now + OUT_GRACE_S
        while now < deadline:
            last = self._in_rotation(model)  # back in rotation: one more try, then told
            if not last:
                if self.directory.coming(model):
                    grace = now + OUT_GRACE_S  # once ready, its first health probe brings it in
                elif now > grace or not self._doubted(model):
                    break
                await self.directory.replica_news(0.25)  # at once when one is ready
            answer, tried = await self._on_model(prepared, model, True, finish, tried, wake=False)
            if answer is not None or last:
                return answer, tried
            now = time.monotonic()
        return None, tried

    def _in_rotation(self, model: Model) -> bool:
        """Whether a ready replica of `model` is in rotation and not doubted (one that answered
        a 5xx, say): then nothing is waited for, the client is told at once."""
        _, ready = self.directory.ready(model)
        return any(not self.health.doubted(rid) for rid in ready)

    def _doubted(self, model: Model) -> bool:
        """Whether a ready replica of `model` is out of rotation or being probed."""
        _, ready = self.directory.ready(model)
        return any(self.health.doubted(rid) for rid in ready)

    def _held_of(self, tokens: list[int] | None, ready: Ready, size: int) -> Callable[[str], int] | None:
        """Where replicas publish KV events, how many of the prompt's leading blocks of text (the
        balancer's: `text_blocks` of the engine's tokens held, the prompt `size` bytes in its
        `tokens`, measured before admission or, for a model that had to wake or a
        fallback, now) each holds; None: the balancer goes by its own index."""
        if tokens is None or not any(r.kv_events for r, _ in ready.values()):
            return None
        engine, n = self.oracle.held(tokens), len(tokens)
        return lambda rid: text_blocks(engine(rid), n, size)

    async def _send(self, one: Try, replica: ReplicaState) -> Answer | Relay | None:
        """One try on one replica; None when it refused or failed before answering. It ends here
        however it went (cancelled, say), unless it became a stream: that ends it."""
        answer = None
        try:
            answer = await self._answer(one, replica)
            return answer
        finally:
            if not isinstance(answer, Relay):
                one.end(ok=None)  # where it had not ended: no word on the replica

    async def _answer(self, one: Try, replica: ReplicaState) -> Answer | Relay | None:
        """The try's request sent; its answer whole, or the stream it became. A stream's engine has
        `first_byte_timeout_s` to start it; any try stops waiting once its replica is out."""
        prepared, model = one.prepared, one.tried.model
        body = prepared.body if model == prepared.model.name else {**prepared.body, "model": model}
        if replica.adapters or "lora" in body:
            adapted = prepared.model if model == prepared.model.name else self.directory.model(model)
            body = engine_body(body, adapted or prepared.model, prepared.adapter, replica)
        read_s = self.health.first_byte_s if prepared.streaming else None
        try:
            async with unless_out(one.outage):
                headers = self.directory.headers(replica)
                if prepared.trace:  # the engine's own tracing (vLLM's) joins the request's trace
                    headers = {**headers, **prepared.trace}
                resp = await self.upstream.post(
                    replica.url, prepared.path, msgspec.json.encode(body), headers, read_s=read_s
                )
        except FAILED as exc:
            one.end(ok=False)
            self.log.warning("replica refused, trying another", replica=replica.id, error=described(exc))
            return None
        if resp.status in (502, 503, 504):
            resp.release()  # unread: its connection is closed
            one.end(ok=False)
            self.log.warning("replica failed before answering, trying another", replica=replica.id, status=resp.status)
            return None
        headers = {"x-llmgw-replica": replica.id}
        if prepared.streaming and resp.status == 200:
            return Relay(one, resp, headers)
        return await self._whole(one, resp, headers)

    async def _whole(self, one: Try, resp: EngineAnswer, headers: dict[str, str]) -> Answer | None:
        """A whole answer read and passed on; None where the replica failed mid-answer."""
        try:
            async with unless_out(one.outage):
                raw = await resp.read()
        except FAILED as exc:
            one.end(ok=False)
            self.log.warning(
                "replica failed mid-answer, trying another", replica=one.tried.replica, error=described(exc)
            )
            return None
        finally:
            resp.release()
        usage = Usage()
        if resp.status == 200:
            raw, usage = answer_of(raw, one.prepared.body["model"])
        elif resp.status in (401, 403):  # the engine refused the router's key: the secrets differ
            self.log.error(
                "an engine refused the router's key: the router's and its agent's engine_secret differ",
                replica=one.tried.replica,
                status=resp.status,
            )
            one.end(ok=False, served=msgspec.structs.replace(one.tried, status=502))
            failed = UpstreamFailed(
                "the model's engine refused the router (a setting of this deployment); try again later"
            )
            return Answer(502, msgspec.json.encode(failed.body()))
        elif resp.status == 501:  # the engine does not serve this endpoint: the request's fault, not the engine's
            model, path = one.prepared.body["model"], one.prepared.path
            refused = NotServed(f"model '{model}' does not serve {path} (its engine has no such endpoint)")
            one.end(ok=True, served=msgspec.structs.replace(one.tried, status=400))
            return Answer(400, msgspec.json.encode(refused.body()))
        elif resp.status == 500 and one.prepared.path == "/v1/embeddings" and (size := input_too_long(raw)):
            model = one.prepared.body["model"]  # the input's fault, not the engine's
            refused = ContextTooLong(
                f"An input is {size} tokens, more than model '{model}' embeds at once; split it into shorter pieces.",
                "input",
            )
            one.end(ok=True, served=msgspec.structs.replace(one.tried, status=400))
            return Answer(400, msgspec.json.encode(refused.body()))
        # a 4xx: the engine refused the request for its content (no word against it); a 5xx: a
        # suspicion its health probe decides at once
        one.end(ok=resp.status < 500, served=msgspec.structs.replace(one.tried, status=resp.status, usage=usage))
        return Answer(resp.status, raw, headers)


def _unanswered(prepared: Prepared, fallbacks: bool) -> ApiError:
    """Why no replica answered: the model is stopped, its replicas have not loaded the adapter
    asked for yet, or none is ready (of its fallbacks either)."""
    primary = prepared.model
    names = " or its fallbacks" if fallbacks else ""
    if primary.stopped is not None:
        also = " and its fallbacks have no ready replica" if names else ""
        return ModelStopped(
            f"The model '{primary.name}' is stopped{also}; "
            f"an operator starts it with `llmgw ctl model start {primary.name}`."
        )
    if prepared.adapter:  # its replicas may be loading it, one at a time
        return NoReadyReplica(
            f"No ready replica of model '{primary.name}' has loaded adapter '{prepared.adapter}' yet; "
            "try again shortly (`llmgw ctl model list` shows its replicas).",
            headers={"retry-after": "5"},
        )
    return NoReadyReplica(
        f"The model '{primary.name}'{names} has no ready replica now; try again shortly "
        "(`llmgw ctl model list` shows why).",
        headers={"retry-after": "5"},
    )


def _counted(finish: Finish, pool: Pool, key: str, reserved: int) -> Finish:
    """`finish`, telling the key's pool first what the request spent in place of what it reserved."""

    def counted(served: Served) -> None:
        pool.spent(key, reserved, served.usage.total, time.time())
        finish(served)

    return counted


def _seconds(retry_after: str | None) -> float | None:
    """A `retry-after` header's seconds (a date, or nothing: None)."""
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:
        return None
