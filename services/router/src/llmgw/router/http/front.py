"""The router's front door: its own HTTP/1.1 server (asyncio, httptools) answering the OpenAI
routes with nothing between the socket and the gateway, and handing every other connection (the
admin API, the console, /schema) to the ASGI app's own server on a private Unix socket, as a
byte tunnel. A general server costs a streamed request more than the router's own work does
(uvicorn and Litestar were half its CPU under load: docs/benchmarks.md); this one does only what
the OpenAI routes need: keep-alive, a body up to the most the router takes, `Expect:
100-continue`, answers whole or streamed in chunks, backpressure, and a stream cut as soon as its
client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import tempfile
from pathlib import Path

from llmgw.bus import HttpServer, get_logger
from llmgw.router.config import RouterConfig
from llmgw.router.http import connection
from llmgw.router.http.connection import Client
from llmgw.router.http.endpoint import OpenAIEndpoint
from llmgw.router.http.seats import Seats

__all__ = ["Front"]


class Front:
    """Serves `endpoint`'s OpenAI routes on the config's `http_host`:`http_port` (0: a free one);
    every other request's connection goes to `app`'s server (uvicorn) on a private socket.

    What a hostile client can hold is bounded: a request's head must come whole within
    `client_header_timeout_s` and within `MOST_HEAD_BYTES`, its body without a pause past
    `client_body_timeout_s` and whole within `client_body_total_s` (408 past either); requests
    pipelined behind an answer are read no further than `SLICE` ahead and answers not read by
    their client stop the reading; connections are limited in all and per client address, the
    longest idle shed first."""

    def __init__(self, endpoint: OpenAIEndpoint, config: RouterConfig) -> None:
        self.endpoint, self.config = endpoint, config
        host, port = config.http_host, config.http_port
        if config.listen_fd >= 0:  # its supervisor's: the connections waiting on it outlive this router
            self.sock = socket.socket(fileno=config.listen_fd)
            host = self.sock.getsockname()[0]
        else:
            self.sock = socket.socket(
                socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
            )
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.folder = tempfile.TemporaryDirectory(prefix="llmgw-router-")
        self.private = str(Path(self.folder.name) / "rest.sock")
        self.rest = HttpServer(endpoint, path=self.private)
        self.server: asyncio.Server | None = None
        self.seats = Seats(config.max_connections or _connections_by_descriptors(), config.max_connections_per_client)
        self.sweeper: asyncio.Task | None = None
        self.log = get_logger("router")

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    @property
    def clients(self) -> set[Client]:
        """The client connections open now."""
        return self.seats.held

    async def start(self) -> None:
        """Start serving; returns once it listens."""
        await self.rest.start()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Client(self), sock=self.sock, backlog=1024)
        self.sweeper = loop.create_task(self._sweep())
        self.log.info("front door", connections=self.seats.most, per_client=self.seats.most_per_client)

    async def _sweep(self) -> None:
        """End the connections past a deadline (one timer for all): kept ones idle for `IDLE_S`,
        heads and bodies too slow (408), tunnels silent for `TUNNEL_SILENT_S`."""
        loop, config = asyncio.get_running_loop(), self.config
        times = (
            connection.IDLE_S,
            config.client_header_timeout_s,
            config.client_body_timeout_s,
            config.client_body_total_s,
        )
        every = max(0.05, min(1.0, *times) / 3)
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for client in list(self.seats.held):
                client.check(now)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop listening at once, let the requests in flight finish (for `grace_s` at most, then
        cut them), close every connection, and stop."""
        if self.server is not None:
            self.server.close()
        if self.sweeper is not None:
            self.sweeper.cancel()
        for client in list(self.clients):
            if client.task is None and client.tunnel is None:  # a tunnel's requests drain in the app's server
                client.close()
        busy = [c.task for c in self.clients if c.task is not None]
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.rest.stop(grace_s)
        for client in list(self.clients):
            client.close()
        self.folder.cleanup()


def _connections_by_descriptors() -> int:
    """The most client connections the descriptors allow (the soft limit raised to the hard one):
    three for each (its own, and its engine's or both ends of the app's), less a reserve for NATS,
    the engines' health probes and the rest, so a flood never leaves the router unable to reach
    its engines."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(64, (soft - min(1024, soft // 4)) // 3)
