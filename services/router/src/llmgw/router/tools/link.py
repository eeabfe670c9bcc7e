"""The router's link to one MCP server, with the official `mcp` client: connected over
streamable HTTP, or over stdio to the program the router starts. It lists the server's tools
(at most `MOST_TOOLS`) and lists them again every `PING_S`, or at once after a call failed in a
way that may mean the connection is gone, and connects again (backing off) when that listing
fails or its program ends: a stdio server is kept running this way. A call is bounded in time and
its result in size; whatever goes wrong is said in words, never raised past the link."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import httpx2

from llmgw.bus import get_logger
from llmgw.proto.tools import McpServer, ServerState
from llmgw.router.tools.capped import MOST_ANSWER_BYTES, MOST_RESULT_BYTES, TOO_LARGE, UNCOMPRESSED, cap_answer

if TYPE_CHECKING:  # the SDK (about 0.6 s to import) loads with the first server linked
    import mcp_types as types
    from mcp import Client

__all__ = ["MOST_RESULT_BYTES", "MOST_TOOLS", "CallFailed", "Link"]

MOST_TOOLS = 1000
"""The most tools one server's are offered (a server listing more gets the first, and says so)."""
PING_S = 10.0
"""How often a ready server's tools are listed again (one that does not answer is connected again;
MCP's ping is gone from its 2026 revision)."""
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before connecting again, one after another failure."""

_log = get_logger("router")


class CallFailed(Exception):
    """A call that got no result: `outcome` (error, timeout) and why, in words."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def _size(result: types.CallToolResult) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True))


class Link:
    """One server, kept connected in the background (`start`, `stop`)."""

    def __init__(self, server: McpServer, headers: dict[str, str], now: Callable[[], float] = time.time) -> None:
        self.server, self.headers, self.now = server, headers, now
        self.state = ServerState(state="connecting", since=now())
        self.tools: dict[str, types.Tool] = {}
        """Its tools by their own names (as it lists them, at most `MOST_TOOLS`)."""
        self._client: Client | None = None
        self._check = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Connect, and stay connected, in the background."""
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        """Close the connection (a stdio server's program is stopped)."""
        if self._task is not None:
            self._task.cancel()

    def _set(self, state: str, reason: str = "") -> None:
        self.state = ServerState(state=state, reason=reason, tools=len(self.tools), since=self.now())  # type: ignore[arg-type]

    def _client_for(self, http: httpx2.AsyncClient) -> Client:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        s = self.server
        if s.transport == "stdio":
            params = StdioServerParameters(command=s.command[0], args=s.command[1:], env=s.env or None)
            return Client(stdio_client(params), read_timeout_seconds=s.timeout_s)  # its stderr: the router's
        http_client = streamable_http_client(s.url, http_client=http, max_sse_event_size=MOST_ANSWER_BYTES)
        return Client(http_client, read_timeout_seconds=s.timeout_s)

    async def _run(self) -> None:
        failures = 0
        while True:
            # the SDK leaves a client it is given open: each connection's closed with it
            headers, hooks = {**self.headers, **UNCOMPRESSED}, {"response": [cap_answer]}
            timeout = httpx2.Timeout(self.server.timeout_s)
            async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
                try:
                    async with asyncio.timeout(self.server.timeout_s):
                        client = await self._client_for(http).__aenter__()
                except Exception as exc:  # not reached, not MCP, its program would not start
                    failures += 1
                    self._set("failed", _why("could not connect", exc))
                else:
                    failures = await self._serve(client, failures)
            await asyncio.sleep(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] if failures else 0)

    async def _serve(self, client: Client, failures: int) -> int:
        """List its tools, and again every `PING_S` (or when a call asks) until that fails; how
        many failures in a row now."""
        self._check = check = asyncio.Event()  # this connection's: a call that fails on it may set it
        try:
            self.tools, left_out = await self._listed(client)
            self._client = client
            self._set("ready", left_out)
            _log.info("mcp server ready", server=self.server.name, tenant=self.server.tenant, tools=len(self.tools))
            failures = 0
            while True:  # listed again: it answers, and its tools are as it has them now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(check.wait(), PING_S)
                check.clear()
                self.tools, left_out = await self._listed(client)
                self._set("ready", left_out)
        except Exception as exc:
            failures += 1
            self._set("failed", _why("it stopped answering", exc))
        finally:
            self._client = None
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)
        return failures

    async def _listed(self, client: Client) -> tuple[dict[str, types.Tool], str]:
        """Its tools, page by page, up to `MOST_TOOLS`, all within the server's `timeout_s`; and
        what was left out, in words."""
        tools: dict[str, types.Tool] = {}
        cursor: str | None = None
        async with asyncio.timeout(self.server.timeout_s):  # a server paging without end fails
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                for tool in page.tools:
                    if len(tools) >= MOST_TOOLS:
                        return tools, f"it lists more than {MOST_TOOLS} tools: the first {MOST_TOOLS} are offered"
                    tools.setdefault(tool.name, tool)
                if not page.next_cursor or page.next_cursor == cursor:
                    return tools, ""
                cursor = page.next_cursor

    async def call(self, tool: str, arguments: dict) -> types.CallToolResult:
        """The tool's result; CallFailed where there is none (not connected, no answer in the
        server's time, a failure on the way, a result over `MOST_RESULT_BYTES`)."""
        client, check = self._client, self._check
        if client is None:
            raise CallFailed(
                "error", f"MCP server '{self.server.name}' is not connected ({self.state.reason or 'yet'})"
            )
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=self.server.timeout_s)
        except Exception as exc:
            import mcp_types as types
            from mcp.shared.exceptions import MCPError

            if isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and exc.code == types.REQUEST_TIMEOUT):
                raise CallFailed("timeout", f"no answer within {self.server.timeout_s:g} s") from None
            if TOO_LARGE in str(exc):  # cut as it arrived (the SDK says so in its own words around ours)
                raise CallFailed("error", TOO_LARGE) from None
            if _maybe_lost(exc):  # the link lists its tools now: connected again only if that fails
                check.set()
            raise CallFailed("error", _why("the call failed", exc)) from None
        if (size := _size(result)) > MOST_RESULT_BYTES:
            raise CallFailed("error", f"its result is {size:,} bytes, over the {MOST_RESULT_BYTES:,} passed back")
        return result


def _maybe_lost(exc: BaseException) -> bool:
    """Whether a failed call may mean the connection is gone (not just that call): the transport's
    own errors, or the SDK's code for a connection closed (which a server may answer with too)."""
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return exc.code == types.CONNECTION_CLOSED
    return isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError) or (
        isinstance(exc, httpx2.TransportError)
    )


def _why(what: str, exc: BaseException) -> str:
    """`what`, and the cause in a line (an exception group's first)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{what}: {type(exc).__name__}{': ' + detail if detail else ''}"
