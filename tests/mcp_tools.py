"""A real MCP server made with the official SDK (`MCPServer`), run by the tests as a company's
tools would be: over stdio (`python tests/mcp_tools.py`) or streamable HTTP (`--http`, printing
`listening on <port>` once it takes requests). Its tools: `add`, `echo`, `shout`, `contact`, `slow`,
`pid`, `big` (a result of N megabytes), `refuse` (a JSON-RPC error of the code asked) and, with
`--many N`, N more; `--token T` makes the HTTP one
refuse requests without `Authorization: Bearer T`."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

__all__ = ["build"]


def build(name: str, many: int) -> MCPServer:
    """The server and its tools."""
    server = MCPServer(name)

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back, with this server's name."""
        return f"{name} heard: {text}"

    @server.tool()
    def shout(text: str) -> str:
        """The text in capitals (what it got, shown)."""
        return text.upper()

    @server.tool()
    def contact() -> str:
        """Where to write (an address the caller never gave)."""
        return "write to bob@example.com"

    @server.tool()
    def tally(counts: dict[str, int]) -> dict[str, int]:
        """The counts given, named as they came (a structured result whose keys are free text)."""
        return dict(counts)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answer after some seconds."""
        await asyncio.sleep(seconds)
        return "done"

    @server.tool()
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @server.tool()
    def big(megabytes: float) -> str:
        """A result of that many megabytes."""
        return "x" * int(megabytes * 1024 * 1024)

    @server.tool()
    def refuse(code: int) -> str:
        """Answer the call with a JSON-RPC error of that code (a server's own error)."""
        raise MCPError(code, "the server refuses")

    for i in range(many):
        server.add_tool(lambda i=i: i, name=f"t{i}", description=f"tool number {i}")
    return server


class _Token:
    """Refuse a request without the bearer token (as a company's tool server would)."""

    def __init__(self, app, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {self.token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no token"})
            return
        await self.app(scope, receive, send)


async def _serve_http(server: MCPServer, token: str, sse: bool) -> None:
    import uvicorn

    app = server.streamable_http_app(stateless_http=True, json_response=not sse)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # Nagle off (uvicorn #3149)
    sock.bind(("127.0.0.1", 0))
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    wrapped = _Token(app, token) if token else app
    config = uvicorn.Config(wrapped, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    """Serve over stdio, or over HTTP with `--http`."""
    ask = argparse.ArgumentParser()
    ask.add_argument("--name", default="tools")
    ask.add_argument("--http", action="store_true")
    ask.add_argument("--many", type=int, default=0)
    ask.add_argument("--token", default="")
    ask.add_argument("--sse", action="store_true", help="over HTTP, answer in event streams (else JSON)")
    args = ask.parse_args()
    server = build(args.name, args.many)
    if args.http:
        asyncio.run(_serve_http(server, args.token, args.sse))
    else:
        print(f"{args.name}: serving over stdio", file=sys.stderr, flush=True)
        server.run("stdio")


if __name__ == "__main__":
    main()
