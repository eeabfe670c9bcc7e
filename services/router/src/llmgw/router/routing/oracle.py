"""The prefix oracle: what each vLLM replica's prefix cache holds, from the KV events it
publishes over ZMQ, and a prompt's tokens as an engine sees them (the tokenize round trip), for
the context check and for matching prompts against those caches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import msgspec
import zmq
import zmq.asyncio

from llmgw.bus import get_logger
from llmgw.proto import Profile, ReplicaState
from llmgw.router.errors import described
from llmgw.router.routing.directory import Directory
from llmgw.router.routing.kvevents import CacheView, decode_batch, token_blocks

__all__ = ["PrefixOracle"]

_FAILED = (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, KeyError, TypeError, ValueError)
"""How a tokenize round trip fails: then the engine checks the length itself."""


class PrefixOracle:
    """Follows the KV events of every ready replica that publishes them, from when it is ready
    until it is gone, and asks engines to tokenize prompts."""

    def __init__(self, directory: Directory, client: aiohttp.ClientSession, tokenize_timeout_s: float) -> None:
        self.directory, self.client = directory, client
        self.timeout = aiohttp.ClientTimeout(total=tokenize_timeout_s)
        self.caches: dict[str, CacheView] = {}
        """What each replica with KV events holds in its prefix cache, as its events say."""
        self.listeners: dict[str, asyncio.Task] = {}
        self.zmq = zmq.asyncio.Context()
        self.log = get_logger("router")
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """Follow the replicas bucket for replicas with KV events."""
        self.task = asyncio.create_task(self._follow())

    def stop(self) -> None:
        """Stop listening."""
        for task in [*([self.task] if self.task else []), *self.listeners.values()]:
            task.cancel()
        self.zmq.destroy(linger=0)

    # -- KV events ------------------------------------------------------------------------------
    async def _follow(self) -> None:
        while True:
            seen = self.directory.replicas.version
            live = self.directory.kv_publishers()
            for rid in set(self.listeners) - set(live):
                self.listeners.pop(rid).cancel()
                self.caches.pop(rid, None)
            for rid, endpoint in live.items():
                if rid not in self.listeners:
                    self.caches[rid] = CacheView()
                    self.listeners[rid] = asyncio.create_task(self._listen(rid, endpoint))
            await self.directory.replica_news(seen=seen)

    async def _listen(self, rid: str, endpoint: str) -> None:
        """One replica's events into its CacheView (ZMQ reconnects by itself if the engine restarts)."""
        sock = self.zmq.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        self.log.info("following KV events", replica=rid, endpoint=endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    if len(frames) != 3:
                        raise msgspec.DecodeError(f"{len(frames)} frames, not 3 (topic, sequence, batch)")
                    _, events = decode_batch(frames[2])
                except msgspec.DecodeError as exc:
                    self.log.warning("KV event batch not understood, skipped", replica=rid, error=str(exc))
                    continue
                self.caches[rid].apply(int.from_bytes(frames[1], "big"), events)
        finally:
            sock.close(linger=0)

    def held(self, tokens: list[int]) -> Callable[[str], int]:
        """How many of these leading tokens a replica holds (whole blocks of its engine's), as its
        events say (0 for a replica without events)."""
        by_size: dict[int, list[bytes]] = {}

        def held(rid: str) -> int:
            view = self.caches.get(rid)
            if view is None or not view.block_size:
                return 0
            if view.block_size not in by_size:
                by_size[view.block_size] = token_blocks(tokens, view.block_size)
            return view.match(by_size[view.block_size]) * view.block_size

        return held

    # -- tokens ---------------------------------------------------------------------------------
    async def tokens(self, asked: dict, replica: ReplicaState, profile: Profile) -> list[int] | None:
        """The prompt of a tokenize request (`request.core.tokenize_request`) as the engine will
        see it, tokenized by `replica` (vLLM's /tokenize; llama-server's /apply-template, then
        /tokenize); None where it cannot be had now."""
        try:
            if profile.engine == "vllm":
                return (await self._post(replica, "/tokenize", asked))["tokens"]
            text = asked.get("prompt")
            if text is None:
                template = {k: v for k, v in asked.items() if k != "model"}
                text = (await self._post(replica, "/apply-template", template))["prompt"]
            tokenize = {"content": text, "add_special": True, "parse_special": True}
            return (await self._post(replica, "/tokenize", tokenize))["tokens"]
        except _FAILED as exc:
            self.log.warning(
                "prompt not tokenized: the engine will check its length", replica=replica.id, error=described(exc)
            )
            return None

    async def _post(self, replica: ReplicaState, path: str, body: dict) -> dict:
        async with self.client.post(
            replica.url + path,
            data=msgspec.json.encode(body),
            headers=self.directory.headers(replica),
            timeout=self.timeout,
        ) as resp:
            if resp.status != 200:
                raise ValueError(f"{path} answered {resp.status}")
            return msgspec.json.decode(await resp.read())
