"""A request's way through the router: its key, its size, its JSON and model, the key's right
to it, its checks and its context (`prepare.py`; the tokens from an engine) all before it is
admitted against its limits; then forwarded (`proxy.py`); and when it ended, its limits, metrics
and usage told from one `Outcome`."""

from __future__ import annotations

import time
import uuid

from litestar import Request
from litestar.response import Response

from llmgw.router.accounts import Accounts
from llmgw.router.config import RouterConfig
from llmgw.router.directory import Directory
from llmgw.router.errors import ApiError
from llmgw.router.metrics import Metrics
from llmgw.router.oracle import PrefixOracle
from llmgw.router.outcome import Outcome, Served, Ticket
from llmgw.router.prepare import check_size, prepare, refusal, resolve
from llmgw.router.proxy import Job, Proxy
from llmgw.router.quota import Scope

__all__ = ["Gateway"]


class Gateway:
    """Answers the OpenAI routes that go to an engine (chat, completions, embeddings)."""

    def __init__(  # noqa: PLR0913 -- one collaborator each, wired by the service
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

    async def handle(self, request: Request, path: str) -> Response:
        """One request: refused saying why (an `ApiError`), or the replica's answer."""
        started = time.perf_counter()
        key_id, key = self.accounts.authorize(request.headers.get("authorization", ""))
        check_size(request.headers.get("content-length"), self.config.max_body_bytes)
        body, asked, model = resolve(await request.body(), self.directory.model)
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.scope.setdefault("state", {})["request_id"] = rid
        ticket = Ticket(request_id=rid, key_id=key_id, project=key.project, model=model.name, started=started)
        try:
            prepared = prepare(path, body, asked, model, key, self.config.max_n)
            _, ready = self.directory.ready(model)
            tokens = await self.oracle.measure(prepared, model, ready.values(), primary=True)
            scopes = self.accounts.scopes(key_id, key)
            verdict = await self.accounts.admit(scopes, time.time())
            if not verdict.ok:
                raise refusal(verdict)
        except ApiError as exc:  # refused before admission: counted as what it got, against no limit
            self._end(ticket, Served(status=exc.status, admitted=False), [])
            raise
        job = Job(prepared=prepared, started=started, headers=verdict.headers, measured=bool(ready), tokens=tokens)
        return await self.proxy.forward(job, lambda served: self._end(ticket, served, scopes))

    def _end(self, ticket: Ticket, served: Served, scopes: list[Scope]) -> None:
        """A request whose model was known ended: its limits, metrics and usage are told."""
        now = time.time()
        outcome = Outcome(ticket=ticket, served=served, latency_s=time.perf_counter() - ticket.started)
        self.metrics.ended(outcome)
        usage = outcome.usage_record(now) if served.replica else None
        self.accounts.ended(scopes, served.usage.total, now, usage)
