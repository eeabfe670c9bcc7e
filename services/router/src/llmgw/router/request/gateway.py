"""A request's way through the router: its key, size, JSON and model, the key's right to it and
its context (`prepare.py`; the tokens from an engine) before it is admitted against its limits;
only then what asks models of the router's own (a judge, the answer cache's and a knowledge
base's embeddings: a key past its limits costs them nothing); then forwarded (`proxy.py`); and
when it ended, its limits, metrics and usage told from one `Outcome`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

import msgspec
import numpy as np

from llmgw.bus import BusError, tracing
from llmgw.proto import KeyRecord, Limits, Model
from llmgw.proto.guard import Policy
from llmgw.proto.knowledge import Hit
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.accounts.limits import Verdict
from llmgw.router.accounts.quota import Scope
from llmgw.router.config import RouterConfig
from llmgw.router.errors import (
    ApiError,
    ContextTooLong,
    InvalidBody,
    ModelNotFound,
    ServiceRefused,
    UpstreamFailed,
    answered_error,
    refused,
)
from llmgw.router.guard.redact import Redaction
from llmgw.router.guard.store import Guards, JudgeUnavailable
from llmgw.router.knowledge import augment
from llmgw.router.knowledge.answers import Answers
from llmgw.router.knowledge.recall import cache_mode
from llmgw.router.knowledge.store import OPENING, Knowledge
from llmgw.router.metrics import Metrics
from llmgw.router.request.adapters import SEPARATOR
from llmgw.router.request.cached import CACHE_REPLICA, Recall, kept_answer, recall, replayed
from llmgw.router.request.core import Prepared, reservation
from llmgw.router.request.guarded import GuardBlocked, Tally, guard_answer, guard_request, guard_texts
from llmgw.router.request.measure import measure
from llmgw.router.request.outcome import Outcome, Served, Ticket
from llmgw.router.request.prepare import (
    check_body,
    check_prompts,
    check_size,
    check_tenant,
    prepare,
    refusal,
    resolve,
)
from llmgw.router.request.proxy import Proxy
from llmgw.router.request.relay import Answer, Relay
from llmgw.router.request.traced import Traces
from llmgw.router.routing.directory import Directory
from llmgw.router.routing.oracle import PrefixOracle

__all__ = ["JUDGE_KEY_ID", "KNOWLEDGE_KEY_ID", "Gateway"]

JUDGE_KEY_ID = "guard-judge"
"""What a guardrail's questions to a judge count under (usage, tokens), per tenant."""
KNOWLEDGE_KEY_ID = "knowledge"
"""What knowledge bases' embeddings of documents and questions count under, per tenant."""
_OWN_KEYS = (JUDGE_KEY_ID, KNOWLEDGE_KEY_ID)
T = TypeVar("T")


class Gateway:
    """Answers the OpenAI routes: the models a key may use, and those that go to an engine
    (chat, completions, embeddings)."""

    def __init__(
        self,
        accounts: Accounts,
        directory: Directory,
        oracle: PrefixOracle,
        proxy: Proxy,
        metrics: Metrics,
        config: RouterConfig,
    ) -> None:
        self.accounts, self.directory, self.oracle = accounts, directory, oracle
        self.proxy, self.metrics, self.config = proxy, metrics, config
        self.guards: Guards | None = None
        """The guardrail policies (None: none are kept: nothing checked)."""
        self.knowledge: Knowledge | None = None
        """The knowledge bases a chat completion may be answered from."""
        self.traces = Traces() if tracing() else None
        """The requests' spans, where this process exports spans (none is made otherwise)."""
        self.answers: Answers | None = None
        """The tenants' answer caches."""

    def _tenant_models(self, key: KeyRecord) -> list[str]:
        """The models `key`'s tenant may use (empty: every one; a dict read, nothing made)."""
        people = self.accounts.people
        tenant = people.tenants.items.get(key.tenant) if people is not None else None
        return tenant.models if tenant is not None else []

    def model_names(self, key: KeyRecord) -> list[str]:
        """The models (and aliases) `key` (and its tenant) may use, sorted."""
        tenant = self._tenant_models(key)
        aliases = self.knowledge.aliases(key.tenant) if self.knowledge is not None else []
        out = []
        for n in [*self.directory.names(), *aliases]:
            model = n.partition(SEPARATOR)[0]  # a key may use a model's adapters where it may use the model
            if (not key.models or n in key.models or model in key.models) and (
                not tenant or n in tenant or model in tenant or n in aliases
            ):
                out.append(n)
        return sorted(out)

    def models(self, authorization: str) -> dict:
        """The models (and aliases) the key in this `Authorization` header may use, as OpenAI
        lists them."""
        names = self.model_names(self.accounts.authorize(authorization)[1])
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "llmgw"} for n in names],
        }

    async def handle(
        self,
        path: str,
        headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        rid: str,
        signed_in: tuple[str, KeyRecord] | None = None,
    ) -> Answer | Relay:
        """One request to `path` with these (lower-case) `headers`, its body from `read`, known
        by `rid`: refused saying why (an `ApiError`), or the replica's answer. `signed_in`: the
        key (its id and record) of a console session, where no `Authorization` header comes."""
        started = time.perf_counter()
        key_id, key = signed_in or self.accounts.authorize(headers.get("authorization", ""))
        check_size(headers.get("content-length"), self.config.max_body_bytes)
        raw = await read()
        check_body(headers.get("content-type"), raw)
        try:
            body, asked, model = resolve(raw, self.directory.model)
        except ModelNotFound as exc:
            body, asked, model = self._bound(raw, key.tenant, exc)
        chat = path == "/v1/chat/completions"
        knowledge, mode = body.pop("knowledge", None), body.pop("cache", None)
        ticket = Ticket(
            request_id=rid, key_id=key_id, project=key.project, tenant=key.tenant, model=model.name, started=started
        )
        carried = self.traces.begin(ticket, path) if self.traces is not None else None
        judging = key_id == JUDGE_KEY_ID  # a guardrail's own question to a judge is not checked again
        policy = (
            self.guards.policy_for(key.tenant, key.project, key_id, model.name) if self.guards and not judging else None
        )
        scopes: list[Scope] = []
        admitted, reserve = 0.0, 0
        try:
            mode = _extras(chat, knowledge, mode)
            prepared = await self._prepare(path, body, asked, model, key)  # as sent: rights, shape, size
            scopes, admitted, reserve, verdict = await self._admit(key_id, key, reservation(prepared))
            # admitted: only now what asks models of the router's own (a judge, embeddings)
            redaction = await self._guard(policy, body) if policy is not None else None
            # answers are kept only where nothing checks them on the way out (an output guard would
            # be skipped by a hit), and never for the router's own questions (a judge's, an embedding's)
            cached = chat and self.answers is not None and policy is None and key_id not in _OWN_KEYS
            cached = cached and SEPARATOR not in asked  # an adapter's answers are not its model's
            seen = await self._recall(body, model, key, mode, knowledge) if cached else None
            sources = None
            if knowledge is not None:  # the prompt with its sources, as many as fit
                prepared, sources = await self._answered_from(knowledge, body, asked, model, key)
            elif redaction:  # the prompt as the engine gets it, placeholders in
                prepared = await self._prepare(path, body, asked, model, key)
            prepared.trace = carried
        except ApiError as exc:  # refused: counted as what it got; an admission given back
            self._end(ticket, Served(status=exc.status, admitted=False), scopes, admitted, reserve)
            raise
        except BaseException as exc:  # failed or cancelled before it was sent on
            if scopes:  # admitted: given back, counted as a client gone or a failure of ours
                status = 499 if isinstance(exc, asyncio.CancelledError) else 500
                self._end(ticket, Served(status=status, admitted=False), scopes, admitted, reserve)
            elif self.traces is not None:  # its span let go, unexported
                self.traces.open.pop(rid, None)
            raise
        if seen is not None and seen.hit is not None:  # answered as before: no replica asked
            saved = seen.hit[0].prompt_tokens + seen.hit[0].completion_tokens
            self._end(ticket, Served(status=200, replica=CACHE_REPLICA, saved=saved), scopes, admitted, reserve)
            hit = replayed(seen.hit, asked, prepared.streaming, prepared.include_usage)
            if sources is not None:
                _said(hit, sources)
            return hit
        answer = await self.proxy.forward(prepared, lambda served: self._end(ticket, served, scopes, admitted, reserve))
        answer.headers.update(verdict.headers)  # the limits' x-ratelimit-*
        if sources is not None:
            _said(answer, sources)
        if policy is not None and redaction is not None:
            answer = await guard_answer(answer, policy, redaction, self.guards, self.metrics.guarded)  # type: ignore[arg-type]
        return kept_answer(self.answers, seen, answer) if seen is not None and self.answers else answer

    async def _admit(self, key_id: str, key: KeyRecord, reserve: int) -> tuple[list[Scope], float, int, Verdict]:
        """A request holding `reserve` tokens admitted against its key's, project's and tenant's
        limits: those scopes, when, `reserve`, the verdict; a limit's 429 raised (nothing counted)."""
        scopes, admitted = self.accounts.scopes(key_id, key), time.time()
        if key_id in _OWN_KEYS:  # part of a request admitted already: its tokens count, not a place
            scopes = [(sid, name, _tokens_only(limits)) for sid, name, limits in scopes]
        verdict = await self.accounts.admit(scopes, admitted, reserve)
        if not verdict.ok:
            raise refusal(verdict)
        if verdict.budget or key_id in self.metrics.budgets:  # down again once a budget resets
            self.metrics.budgets[key_id] = verdict.budget
        return scopes, admitted, reserve, verdict

    def _bound(self, raw: bytes, tenant: str, missing: ModelNotFound) -> tuple[dict, str, Model]:
        """A request to a knowledge base's alias: one to its model, answered from it (`missing`
        raised where the name is no alias of the tenant's either)."""
        body = msgspec.json.decode(raw)
        base = self.knowledge.bound(tenant, body["model"]) if self.knowledge is not None else None
        model = self.directory.model(base.model) if base is not None else None
        if base is None or model is None:
            raise missing
        body.setdefault("knowledge", base.name)
        body["model"] = base.model
        return body, base.alias, model  # a key allowed the alias may ask it

    async def _recall(self, body: dict, model: Model, key: KeyRecord, mode: str, knowledge: object) -> Recall | None:
        """The answer cache's look at a chat completion (the knowledge base it names, as the base
        is now, must be the same for a kept answer to answer it)."""
        assert self.answers is not None
        base = ""
        if knowledge is not None:
            asked = augment.asked_of(knowledge)
            edition = self.knowledge.edition(key.tenant, asked.base) if self.knowledge is not None else ""
            base = f"{asked.base} top={asked.top} {edition}"
        return await recall(self.answers, self.embed, body, (key.tenant, model.name), mode, base)

    async def ask_judge(self, model: str, messages: list[dict], grammar: str, tenant: str) -> str:
        """A judge model's answer about `messages`, asked through this router's own routing
        (replicas, health, limits and usage under the tenant's judge); JudgeUnavailable where it
        cannot answer."""
        body = {"model": model, "messages": messages, "grammar": grammar, "max_tokens": 32, "temperature": 0}
        judge = KeyRecord(name="guard-judge", created=0.0, tenant=tenant, owner="llmgw guardrails")
        try:
            answer = await self.ask_self("/v1/chat/completions", body, JUDGE_KEY_ID, judge)
            return answer["choices"][0]["message"]["content"]
        except ApiError as exc:
            raise JudgeUnavailable(exc.message) from None
        except (KeyError, IndexError, TypeError):
            raise JudgeUnavailable("its answer is not a chat completion") from None

    async def embed(self, model: str, texts: list[str], tenant: str) -> np.ndarray:
        """The vectors of `texts` (one unit-length row each) from embedding model `model`, asked
        through this router's own routing under the tenant's knowledge key; its refusals raised
        (`ApiError`: no replica ready, an input too long)."""
        key = KeyRecord(name="knowledge", created=0.0, tenant=tenant, owner="llmgw knowledge")
        answer = await self.ask_self("/v1/embeddings", {"model": model, "input": texts}, KNOWLEDGE_KEY_ID, key)
        try:
            rows = sorted(answer["data"], key=lambda d: d["index"])
            vectors = np.asarray([d["embedding"] for d in rows], dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            raise UpstreamFailed(f"model '{model}' did not answer with embeddings") from None
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise UpstreamFailed(f"model '{model}' answered {len(vectors)} embeddings for {len(texts)} texts")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1.0, norms)

    async def ask_self(self, path: str, body: dict, key_id: str, key: KeyRecord) -> dict:
        """This router's own answer (JSON, not streamed) to `body` on `path`, asked as `key`
        (`key_id` in usage and limits): what the router's own features ask models; a refusal
        raised as the `ApiError` a client would have been answered with."""
        raw = msgspec.json.encode(body)

        async def read() -> bytes:
            return raw

        headers = {"content-type": "application/json", "content-length": str(len(raw))}
        answer = await self.handle(path, headers, read, f"{key_id}-{time.time_ns()}", (key_id, key))
        if not isinstance(answer, Answer):
            await answer.close()
            raise UpstreamFailed("a stream came where none was asked for")
        if answer.status != 200:
            raise answered_error(answer.status, answer.body)
        try:
            return msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            raise UpstreamFailed("the answer is not JSON") from None

    @contextlib.asynccontextmanager
    async def counted(self, key_id: str, key: KeyRecord) -> AsyncIterator[None]:
        """Within it, a request that asks no model (a tool call) counts against the key's, project's
        and tenant's limits: a request, one in flight while it lasts, no tokens; else their 429."""
        scopes, _, _, _ = await self._admit(key_id, key, 0)
        try:
            yield
        finally:
            self.accounts.ended(scopes, 0, 0, time.time(), None)

    async def _guard(self, policy: Policy, body: dict) -> Redaction:
        """The request's texts checked by `policy` (redacted in `body`); GuardBlocked where it
        blocks. Counted in the metrics, and remembered (what was found, how long it took)."""
        return await self._guarded(policy, lambda tally: guard_request(policy, body, self.guards, tally))

    async def guard_tool(self, policy: Policy, texts: list[str], way: str, redaction: Redaction) -> list[str]:
        """A tool call's texts (its arguments: input; its result: output) checked by `policy`,
        counted and remembered as a request's are; GuardBlocked where it blocks."""
        tool_way = f"tool {way}"
        return await self._guarded(
            policy, lambda tally: guard_texts(texts, policy, tool_way, self.guards, redaction, tally)
        )

    async def _guarded(self, policy: Policy, check: Callable[[Tally], Awaitable[T]]) -> T:
        assert self.guards is not None
        seen: list[tuple[str, str]] = []

        def tally(name: str, found: list[tuple[str, str]]) -> None:
            self.metrics.guarded(name, found)
            seen.extend(found)

        started, blocked = time.perf_counter(), False
        try:
            return await check(tally)
        except GuardBlocked:
            blocked = True
            raise
        finally:
            self.guards.remember(policy, seen, (time.perf_counter() - started) * 1000, blocked)

    async def _prepare(self, path: str, body: dict, asked: str, model: Model, key: KeyRecord) -> Prepared:
        """The request checked and, where its model has ready replicas, its prompt measured (a 400
        where it does not fit the context); else it is measured once the model woke."""
        check_tenant(asked, model, key, self._tenant_models(key))
        prepared = prepare(path, body, asked, model, key, self.config.max_n)
        check_prompts(prepared, self.config.max_prompts)
        _, ready = self.directory.ready(model)
        tokens = await measure(self.oracle, prepared, model, ready.values(), primary=True)
        return msgspec.structs.replace(prepared, measured=bool(ready), tokens=tokens)

    async def _answered_from(
        self, knowledge: object, body: dict, asked: str, model: Model, key: KeyRecord
    ) -> tuple[Prepared, list[dict]]:
        """A chat completion to be answered from the knowledge base it names: its best chunks put
        in the prompt as sources, as many as fit the model's context (counted by its tokenizer
        where a replica is ready), and the sources given."""
        want = augment.asked_of(knowledge)
        if self.knowledge is None:
            raise ServiceRefused(503, "server_error", "knowledge_opening", OPENING)
        try:
            base = self.knowledge.base(key.tenant, want.base)
            question = augment.question_of(body.get("messages"))
            hits: list[Hit] = await self.knowledge.retrieve(key.tenant, want.base, question, want.top or base.top)
        except BusError as exc:
            raise refused("router", exc.code, exc.message) from None
        messages = body["messages"]
        while True:
            body["messages"] = augment.with_sources(messages, hits, want.base)
            try:
                prepared = await self._prepare("/v1/chat/completions", body, asked, model, key)
            except ContextTooLong:
                if not hits:
                    raise
                hits = hits[:-1]  # the least similar left out, until the rest fit
                continue
            return prepared, augment.sources_of(hits, want.base)

    def _end(self, ticket: Ticket, served: Served, scopes: list[Scope], admitted: float, reserve: int) -> None:
        """A request whose model was known ended: its limits (the `reserve` tokens it held let go),
        metrics and usage are told. One refused for itself after its admission (at `admitted`)
        gives that admission back."""
        now = time.time()
        outcome = Outcome(ticket=ticket, served=served, latency_s=time.perf_counter() - ticket.started)
        self.metrics.ended(outcome)
        if self.traces is not None:
            self.traces.end(outcome)
        if not served.admitted:
            self.accounts.give_back(scopes, admitted, reserve, now)
            return
        usage = outcome.usage_record(now) if served.replica else None
        self.accounts.ended(scopes, reserve, served.usage.total, now, usage)


def _tokens_only(limits: Limits) -> Limits:
    """`limits` without those on requests (the router's own questions count their tokens only)."""
    return msgspec.structs.replace(limits, requests_per_minute=None, concurrent=None)


def _extras(chat: bool, knowledge: object, mode: object) -> str:
    """The request's `cache` mode; a 400 where `knowledge` or `cache` is sent with anything but
    a chat completion."""
    if not chat and (knowledge is not None or mode is not None):
        raise InvalidBody("'knowledge' and 'cache' are for /v1/chat/completions only.")
    return cache_mode(mode)


def _said(answer: Answer | Relay, sources: list[dict]) -> None:
    """The sources an answer was given, in its header (streamed or not) and its body (not)."""
    answer.headers[augment.SOURCES_HEADER] = augment.sources_header(sources)
    if isinstance(answer, Answer) and answer.status == 200:
        answer.body = augment.body_with_sources(answer.body, sources)
