"""Telling the scheduler an on-demand model is wanted (the demand bucket), and waiting for one
at zero to wake."""

from __future__ import annotations

import asyncio
import time

import msgspec
from nats.js.kv import KeyValue

from llmgw.bus import get_logger, spawn
from llmgw.proto import Demand, Model
from llmgw.router.routing.directory import Directory

__all__ = ["DemandSignal"]


class DemandSignal:
    """Writes when each on-demand model was last asked for: at most every `every_s` while it
    runs, at once when it sleeps."""

    def __init__(
        self, kv: KeyValue, directory: Directory, every_s: float, wake_timeout_s: float, replace_wait_s: float
    ) -> None:
        self.kv, self.directory = kv, directory
        self.every_s, self.wake_timeout_s, self.replace_wait_s = every_s, wake_timeout_s, replace_wait_s
        self.told: dict[str, float] = {}
        """Model -> when the router last wrote its demand."""
        self.tasks: set[asyncio.Task] = set()
        self.log = get_logger("router")

    def tell(self, model: Model, now: float, force: bool = False) -> None:
        """For on-demand models: tell the scheduler it is wanted (off the hot path)."""
        if model.scaling.idle_timeout_s is None:
            return
        if force or now - self.told.get(model.name, 0.0) >= self.every_s:
            self.told[model.name] = now
            record = msgspec.json.encode(Demand(model=model.name, last_asked=now))
            spawn(
                self.tasks, self.kv.put(model.name, record), self.log, f"telling the scheduler '{model.name}' is wanted"
            )

    async def ready_soon(self, model: Model) -> bool:
        """For a model with no ready replica: whether one became ready within the wait that fits
        (an on-demand model woken: `wake_timeout_s`; a replica being started or replaced, after an
        engine died or a node was lost: `replace_wait_s`); False at once when none is coming."""
        if model.scaling.idle_timeout_s is not None:
            self.tell(model, time.time(), force=True)
            self.log.info("waking an on-demand model", model=model.name)
            return await self._until_ready(model, self.wake_timeout_s)
        if self.directory.coming(model):
            return await self._until_ready(model, self.replace_wait_s)
        return False

    async def _until_ready(self, model: Model, timeout_s: float) -> bool:
        """Whether a replica of `model` is ready within `timeout_s`: looked at whenever the
        replicas bucket changes (the moment one is ready), and every quarter second besides."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            await self.directory.replica_news(min(left, 0.25))
            if self.directory.ready(model)[0]:
                return True
        return False

    def stop(self) -> None:
        """Drop writes not yet done."""
        for task in self.tasks:
            task.cancel()
