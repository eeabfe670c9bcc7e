"""The knowledge routes that are not an endpoint table's: a document sent in over HTTP (a file is
larger than a NATS message), and OpenAI's vector store search for any key of the base's tenant.
The bases themselves, their trees and removals are the admin API's routes from `proto.knowledge`
(`ctl kb` asks the same)."""

from __future__ import annotations

from collections.abc import Callable

from litestar import Request, Router, post, put
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from llmgw.bus import BusError
from llmgw.proto.knowledge import MOST_BYTES, Document, Hit
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.errors import InvalidBody, ServiceRefused, refused
from llmgw.router.knowledge.store import OPENING, Knowledge, no_base

__all__ = ["knowledge_routes", "search_page"]


def search_page(base: str, query: str, hits: list[Hit]) -> dict:
    """Hits as OpenAI's vector store search answers them."""
    return {
        "object": "vector_store.search_results.page",
        "search_query": [query],
        "data": [
            {
                "file_id": h.path,
                "filename": h.path.rsplit("/", 1)[-1],
                "score": h.score,
                "attributes": {"base": base, "path": h.path, "chunk": h.chunk},
                "content": [{"type": "text", "text": h.text}],
            }
            for h in hits
        ],
        "has_more": False,
        "next_page": None,
    }


def knowledge_routes(opened: Callable[[], Knowledge | None], accounts: Accounts) -> list[Router]:
    """`PUT /api/v1/knowledge/{tenant}/{base}/documents/{path}` (a member of the tenant, or an
    admin) and `POST /v1/vector_stores/{base}/search` (a key of the base's tenant); `opened` gives
    the knowledge bases once the router has opened them (a 503 before)."""

    def knowledge_now() -> Knowledge:
        found = opened()
        if found is None:
            raise ServiceRefused(503, "server_error", "knowledge_opening", OPENING)
        return found

    def member(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        who = accounts.principal(connection.headers.get("authorization", ""))
        tenant, name = connection.path_params.get("tenant", ""), connection.path_params.get("base", "")
        who.check_tenant(tenant, "member", no_base(tenant, name), "Sending a document")
        connection.state.who = who

    @put("/{tenant:str}/{base:str}/documents/{path:path}", status_code=202, request_max_body_size=MOST_BYTES)
    async def upload(request: Request, tenant: str, base: str, path: str) -> Document:
        """A document in (its bytes the body, its place in the tree the path): read at once,
        then embedded in the background (its state says how far)."""
        try:
            data, by = await request.body(), request.state.who.name
            return await knowledge_now().upload(tenant, base, path.lstrip("/"), data, by)
        except BusError as exc:
            raise refused("router", exc.code, exc.message) from None

    @post("/{base:str}/search", status_code=200)
    async def search(request: Request, base: str, data: dict) -> dict:
        """OpenAI's vector store search: `{"query": "...", "max_num_results": 10}`."""
        _, key = accounts.authorize(request.headers.get("authorization", ""))
        query, most = data.get("query"), data.get("max_num_results", 10)
        if isinstance(query, list) and len(query) == 1:
            query = query[0]
        if not isinstance(query, str) or not query.strip():
            raise InvalidBody("'query' is the question to search for (a string).", "query")
        if not isinstance(most, int) or isinstance(most, bool) or not 1 <= most <= 50:
            raise InvalidBody("'max_num_results' is from 1 to 50.", "max_num_results")
        try:
            hits = await knowledge_now().retrieve(key.tenant, base, query, most)
        except BusError as exc:
            raise refused("router", exc.code, exc.message) from None
        return search_page(base, query, hits)

    return [
        Router("/api/v1/knowledge", route_handlers=[upload], guards=[member], include_in_schema=True),
        Router("/v1/vector_stores", route_handlers=[search]),
    ]
