"""The gateway's one MCP endpoint (`/mcp`), served with the official `mcp` SDK over streamable
HTTP, stateless (any router of several answers any request): a client signs in with its llmgw
key (`Authorization: Bearer ...`, checked on every request), lists the tools its rules let it
use, and calls them; a call that fails comes back as the tool's error result, saying why. The
SDK (about 0.6 s to import) loads with the first request, not with the router."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from litestar.handlers import ASGIRouteHandler, asgi
from litestar.types import Receive, Scope, Send

from llmgw.proto.router import KeyRecord
from llmgw.router.errors import ApiError
from llmgw.router.tools.link import CallFailed
from llmgw.router.tools.store import ToolRefused, Tools

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["McpFace"]

_SIGNED_IN = "llmgw.key"
"""Where the signed-in key (id, record) sits in a request's ASGI scope."""
Authorize = Callable[[str], tuple[str, KeyRecord]]


class McpFace:
    """The MCP endpoint over `tools`, for keys `authorize` lets in (an `Authorization` header ->
    the key's id and record; an ApiError where it does not hold). An ASGI app (`__call__`); the
    SDK's transport is made, and kept running in a task, with the first request let in."""

    def __init__(self, tools: Callable[[], Tools | None], authorize: Authorize, version: str) -> None:
        self.tools, self.authorize, self.version = tools, authorize, version
        self._made: tuple[StreamableHTTPSessionManager, asyncio.Event] | None = None
        """The SDK's transport, and whether it runs yet."""
        self._task: asyncio.Task | None = None

    async def _transport(self) -> StreamableHTTPSessionManager:
        """The SDK's transport, running: made by the first request (those at the same time wait)."""
        if self._made is None:
            from mcp.server import Server
            from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

            server = Server(
                "llmgw",
                version=self.version,
                instructions="The tools of your tenant's MCP servers, each named <server>__<tool>.",
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
            )
            self._made = (StreamableHTTPSessionManager(app=server, stateless=True, json_response=True), asyncio.Event())
            self._task = asyncio.create_task(self._run(*self._made))
        manager, running = self._made
        await running.wait()
        return manager

    def stop(self) -> None:
        """Stop taking requests."""
        if self._task is not None:
            self._task.cancel()

    def route(self) -> ASGIRouteHandler:
        """Its route in the router's Litestar app: `/mcp` (and under it)."""
        face = self

        async def mcp(scope: Scope, receive: Receive, send: Send) -> None:
            await face(scope, receive, send)

        return asgi("/mcp", is_mount=True, copy_scope=False)(mcp)

    @staticmethod
    async def _run(manager: StreamableHTTPSessionManager, running: asyncio.Event) -> None:
        async with manager.run():
            running.set()
            await asyncio.Event().wait()

    async def __call__(self, scope, receive, send) -> None:
        """An HTTP request to /mcp: its key checked, then handed to the SDK's transport."""
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers") or [])
        try:
            scope[_SIGNED_IN] = self.authorize(headers.get(b"authorization", b"").decode("latin-1"))
        except ApiError as exc:
            await _answer(send, exc.status, exc.body(), {"www-authenticate": 'Bearer realm="llmgw"'})
            return
        if scope.get("method") != "POST":  # stateless: no stream of its own to open, no session to end
            body = {"error": {"message": "This MCP endpoint takes POST only: it keeps no stream or session."}}
            await _answer(send, 405, body, {"allow": "POST"})
            return
        if self.tools() is None:
            body = {"error": {"message": "The router is still opening its tools; try again in a moment."}}
            await _answer(send, 503, body, {"retry-after": "2"})
            return
        await (await self._transport()).handle_request(scope, receive, send)

    def _signed_in(self, ctx: ServerRequestContext) -> tuple[str, KeyRecord]:
        request = ctx.request
        found = request.scope.get(_SIGNED_IN) if request is not None else None
        if found is None:  # every request came through __call__: a bug if not
            raise RuntimeError("an MCP request reached its handler without a signed-in key")
        return found

    async def _list_tools(
        self, ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        import mcp_types as types  # loaded with the SDK

        key_id, key = self._signed_in(ctx)
        tools = self.tools()
        offered = tools.offered(key_id, key) if tools is not None else {}
        return types.ListToolsResult(
            tools=[
                tool.model_copy(update={"name": name, "description": _described(link.server.name, tool)})
                for name, (link, tool) in sorted(offered.items())
            ]
        )

    async def _call_tool(self, ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        key_id, key = self._signed_in(ctx)
        tools = self.tools()
        if tools is None:
            return _failed("The router is still opening its tools; try again in a moment.")
        try:
            return await tools.call(key_id, key, params.name, dict(params.arguments or {}))
        except (ToolRefused, CallFailed) as exc:
            return _failed(exc.reason)


def _described(server: str, tool: types.Tool) -> str:
    return f"[{server}] {tool.description or ''}".strip()


def _failed(reason: str) -> types.CallToolResult:
    import mcp_types as types  # loaded with the SDK

    return types.CallToolResult(content=[types.TextContent(type="text", text=reason)], is_error=True)


async def _answer(send, status: int, body: dict, headers: dict[str, str]) -> None:
    data = msgspec.json.encode(body)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    with contextlib.suppress(Exception):
        await send({"type": "http.response.body", "body": data})
