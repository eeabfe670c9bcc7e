"""Serve an ASGI app (Litestar) inside a service's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

__all__ = ["HttpServer"]


class _Server(uvicorn.Server):
    """uvicorn's server, ticking once a second instead of ten times: its tick only renews the
    Date header (to the second) and looks for the stop, which `stop` here wakes at once. An idle
    service then wakes 1 time a second for it, not 10."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stopping = asyncio.Event()

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # a counter of 0: its once-a-second work every time
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 1.0)


class HttpServer:
    """uvicorn on a socket bound here (port 0 picks a free one; or a Unix socket at `path`); the
    service owns the signals."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, path: str | None = None) -> None:
        if path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(path)
        else:
            # proto given: accepted sockets inherit it, and asyncio turns Nagle off (TCP_NODELAY)
            # only on sockets that say IPPROTO_TCP; left 0, every keep-alive request waits ~40 ms
            # on a delayed ACK (uvicorn issue #3149).
            self.sock = socket.socket(
                socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
            )
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            port = self.sock.getsockname()[1]
        self.host, self.port = host, port
        self.server = _Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="httptools")
        )
        self.server.capture_signals = contextlib.nullcontext  # the service's runner handles SIGTERM
        self.task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Start serving; returns once it listens."""
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop listening at once, finish open requests (those still open after `grace_s`, when
        given, are cancelled), and stop."""
        self.server.config.timeout_graceful_shutdown = grace_s
        self.server.should_exit = True
        self.server.stopping.set()
        if self.task:
            await self.task
