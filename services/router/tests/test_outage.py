"""`unless_out`: a wait on a replica ends as ReplicaDown when the replica goes out of rotation,
with no task of its own; a cancellation from elsewhere (the client leaving) stays one."""

import asyncio

import pytest

from llmgw.router.routing.health import Outage, ReplicaDown, unless_out


async def test_a_replica_already_out_is_refused_at_once():
    outage = Outage()
    outage.go_out()
    with pytest.raises(ReplicaDown, match="health probe"):
        async with unless_out(outage):
            raise AssertionError("not reached")


async def test_going_out_cuts_the_wait_and_the_task_carries_on():
    outage = Outage()

    async def request():
        with pytest.raises(ReplicaDown):
            async with unless_out(outage):
                await asyncio.sleep(30)
        await asyncio.sleep(0)  # not left cancelled: it can wait on something else (another replica)
        return "tried elsewhere"

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    outage.go_out()
    assert await asyncio.wait_for(task, 5) == "tried elsewhere"
    assert outage.cuts == set()


async def test_a_wait_that_ends_first_leaves_nothing_registered():
    outage = Outage()
    async with unless_out(outage):
        await asyncio.sleep(0)
    assert outage.cuts == set()
    outage.go_out()  # nothing to cut; no error


@pytest.mark.parametrize("also_out", [False, True], ids=["client-left", "client-left-as-it-went-out"])
async def test_the_client_leaving_stays_a_cancellation(also_out):
    outage = Outage()
    entered = asyncio.Event()

    async def request():
        async with unless_out(outage):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(request())
    await entered.wait()
    task.cancel()
    if also_out:
        outage.go_out()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outage.cuts == set()
