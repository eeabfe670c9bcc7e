"""A client connection handed to the router's own app server (the admin API, the console) on its
private socket: bytes both ways, and when they last passed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw.router.http.connection import Client

__all__ = ["TUNNEL_SILENT_S", "Tunnel"]

TUNNEL_SILENT_S = 300.0
"""A connection handed to the app's server with no byte either way for this long is closed (the
longest operator operation, a purge, waits 150 s)."""


class Tunnel(asyncio.Protocol):
    """A client's bytes to the app's server and back, once its connection was handed over."""

    def __init__(self, client: Client, first: bytes) -> None:
        self.client = client
        self.pending = [first]
        self.last = asyncio.get_running_loop().time()
        """When a byte last passed, either way."""
        self.transport: asyncio.Transport | None = None
        self.task = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_unix_connection(lambda: self, self.client.front.private)
        except OSError as exc:
            self.client.front.log.error("the router's own app server is not there", error=str(exc))
            self.client.close()

    def send(self, data: bytes) -> None:
        """Bytes from the client."""
        self.last = asyncio.get_running_loop().time()
        if self.transport is None:
            self.pending.append(data)
        else:
            self.transport.write(data)

    def close(self) -> None:
        """The client went away."""
        if self.transport is not None:
            self.transport.close()
        else:
            self.task.cancel()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected to the app: what the client sent so far goes first."""
        self.transport = transport  # type: ignore[assignment]
        if self.client.closed:
            transport.close()
            return
        transport.write(b"".join(self.pending))
        self.pending = []

    def data_received(self, data: bytes) -> None:
        """The app's bytes, to the client."""
        self.last = asyncio.get_running_loop().time()
        self.client._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """The app closed: so does the client."""
        self.client.close()
