"""`llmgw ctl upgrade` and `releases` find the machines by asking every agent on a real
nats-server: an agent just replaced may not listen yet, or answer late while it starts; both are
waited for, and a fleet with no agent is said after the patience given."""

import asyncio
import time

import msgspec

from llmgw.ctl.upgrade_commands import machines
from llmgw.proto.release import RELEASE_LIST, Release


async def _agent(nc, node: str, late_s: float = 0.0):
    """An agent's release endpoint: answers each ask after `late_s`."""

    async def answer(msg):
        await asyncio.sleep(late_s)
        await nc.publish(msg.reply, msgspec.json.encode(Release(node=node, version="installed", state="idle")))

    return await nc.subscribe(RELEASE_LIST.subject(), cb=answer)


async def test_an_agent_that_listens_only_after_the_first_ask_is_found(nc):
    async def start_late():
        await asyncio.sleep(1.5)  # the ask before this is told nobody listens
        return await _agent(nc, "node-a")

    later = asyncio.create_task(start_late())
    found = await machines(nc)
    await (await later).unsubscribe()
    assert [r.node for r in found] == ["node-a"]


async def test_an_agent_answering_later_than_one_second_is_found(nc):
    sub = await _agent(nc, "node-b", late_s=1.4)
    found = await machines(nc)
    await sub.unsubscribe()
    assert [(r.node, r.state) for r in found] == [("node-b", "idle")]


async def test_a_node_the_scheduler_hears_is_waited_for_though_another_answered(nc):
    # Two machines, one of them starting its agent again: `upgrade` must not go on without it.
    quick = await _agent(nc, "node-a")

    async def start_late():
        await asyncio.sleep(1.5)
        return await _agent(nc, "node-b")

    later = asyncio.create_task(start_late())
    found = await machines(nc, expected=frozenset({"node-a", "node-b"}))
    await (await later).unsubscribe()
    await quick.unsubscribe()
    assert sorted(r.node for r in found) == ["node-a", "node-b"]


async def test_no_agent_is_said_once_the_patience_is_spent(nc):
    began = time.monotonic()
    assert await machines(nc, patience_s=1.0) == []
    assert time.monotonic() - began >= 1.0  # asked again, not given up at the first "nobody listens"
