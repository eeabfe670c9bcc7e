"""This machine's release, as its agent answers for it: what the supervisor (`llmgw up`,
`llmgw node join`) says it runs, a request for another installed release passed on to it, and
each change of its progress published as an event. The supervisor does the replacing, the agent
last: this agent hands its ready engines to the next one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from llmgw.bus import Context, read_release, release_python, write_release_ask
from llmgw.proto import Empty
from llmgw.proto.errors import BadRequest, Conflict
from llmgw.proto.release import RELEASE_CHANGED, RELEASE_LIST, RELEASE_SET, Release, ReleaseAsk

__all__ = ["Upgrades"]

_LOOK_S = 0.5
"""How often the supervisor's file is read for a change to publish."""


class Upgrades:
    """The release endpoints of node `node`, whose supervisor keeps its files under `home`."""

    def __init__(self, home: Path, node: str) -> None:
        self.home, self.node = home, node

    async def start(self, ctx: Context) -> asyncio.Task:
        """Serve this node's release endpoints; the task that publishes each change."""
        await ctx.serve(RELEASE_SET, self.set, node=self.node)
        await ctx.serve(RELEASE_LIST, self.show)
        return asyncio.get_running_loop().create_task(self._follow(ctx))

    def _now(self) -> Release:
        said = read_release(self.home)
        if said is None:
            return Release(node=self.node, state="unsupervised")
        return msgspec.structs.replace(said, node=self.node)

    async def show(self, _: Empty) -> Release:
        """What this machine runs and how far its upgrade is."""
        return self._now()

    async def set(self, ask: ReleaseAsk) -> Release:
        """Pass a request for release `ask.version` to the supervisor; refused (saying why) where
        it is not installed here, nobody supervises this agent, or another upgrade is under way."""
        now = self._now()
        if now.state == "unsupervised":
            raise BadRequest(
                f"node {self.node} is not run by `llmgw up` or `llmgw node join` (no {self.home / 'up'}/release.json): "
                "upgrade it with the tool that installed it"
            )
        if now.state == "running" and now.version != ask.version:
            raise Conflict(f"node {self.node} is upgrading to {now.version} now; wait for it, then ask again")
        try:
            release_python(self.home, ask.version, installed="/")
        except ValueError as exc:
            raise BadRequest(f"node {self.node}: {exc}") from None
        write_release_ask(self.home, msgspec.structs.replace(ask, by=ask.by or "ctl"))
        return msgspec.structs.replace(now, waiting_for=f"the supervisor to take up {ask.version}", changed=time.time())

    async def _follow(self, ctx: Context) -> None:
        said = self._now()
        while True:
            await asyncio.sleep(_LOOK_S)
            now = self._now()
            if now != said:
                said = now
                await ctx.nc.publish(RELEASE_CHANGED.subject(self.node), msgspec.json.encode(now))
