"""The asks to agents over a fake NATS connection: whatever an agent answers (or however the ask
fails), what came of it goes back to the inbox; a failed task is logged; the engine's key goes
only to the node that runs the engine."""

import asyncio
from types import SimpleNamespace

import msgspec

from llmgw.proto import (
    Model,
    Profile,
    ReplicaReport,
    ReplicaStart,
    ReplicaState,
    Worker,
    agent,
)
from llmgw.scheduler.agents import Agents
from llmgw.scheduler.applier import Applier
from llmgw.scheduler.core import AgentStop, Plan, Policy, Stop
from llmgw.scheduler.inbox import Inbox, Stopped, WorkersUp

MODEL = Model(name="m", source="o/r/m.gguf")
PROFILE = Profile(name="cpu")


class FakeNats:
    """Answers each request with `answer(subject, data)`: bytes, or an exception raised."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    async def request(self, subject, data, timeout=None, headers=None):
        self.asked.append((subject, data))
        return SimpleNamespace(headers=None, data=self.answer(subject, data))


class Log:
    """Keeps what was logged: (level, event, fields)."""

    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda event, **fields: self.lines.append((level, event, fields))


def replica(workers=()):
    return ReplicaState(id="r1", model="m", profile="cpu", node="a", workers=list(workers))


def raises(exc):
    def answer(subject, data):
        raise exc

    return answer


async def drained(agents, inbox):
    """What the asks in flight queued, once they are done."""
    await asyncio.gather(*agents.tasks, return_exceptions=True)
    items = []
    while True:
        try:
            items.append(await asyncio.wait_for(inbox.get(), timeout=0.05))
        except TimeoutError:
            return items


async def test_a_start_whose_ask_fails_unexpectedly_is_reported_failed_not_left_pending():
    inbox, log = Inbox(), Log()
    agents = Agents(FakeNats(raises(RuntimeError("connection closed"))), inbox, log)
    agents.start(replica(), MODEL, PROFILE, [])
    [report] = await drained(agents, inbox)
    assert isinstance(report, ReplicaReport) and (report.id, report.state) == ("r1", "failed")
    assert "connection closed" in report.error


async def test_a_start_answered_with_garbage_is_reported_failed():
    inbox = Inbox()
    agents = Agents(FakeNats(lambda subject, data: b"not json"), inbox, Log())
    agents.start(replica(), MODEL, PROFILE, [])
    [report] = await drained(agents, inbox)
    assert report.state == "failed" and "is not a ReplicaReport" in report.error


async def test_a_stop_whose_ask_fails_unexpectedly_still_frees_the_record_and_stops_its_workers():
    inbox, log = Inbox(), Log()
    nats = FakeNats(raises(RuntimeError("connection closed")))
    agents = Agents(nats, inbox, log)
    r = replica(workers=[Worker(node="b")])
    agents.retire(Stop(replica=r, reason="removed"))
    items = await drained(agents, inbox)
    assert items == [Stopped(replica=r, reason="removed")]
    assert [s for s, _ in nats.asked] == [agent.REPLICA_STOP.subject("a"), agent.WORKER_STOP.subject("b")]
    assert any("connection closed" in str(fields) for _, _, fields in log.lines)


async def test_a_task_that_fails_is_logged():
    log = Log()
    agents = Agents(FakeNats(raises(RuntimeError("x"))), Inbox(), log)

    async def broken():
        raise RuntimeError("it broke")

    task = agents._spawn(broken())
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)  # the done-callbacks run
    assert [(level, event) for level, event, _ in log.lines] == [("error", "asking an agent failed")]
    assert "it broke" in log.lines[0][2]["error"]


async def test_a_replica_across_nodes_starts_its_workers_first_and_then_its_engine():
    def answer(subject, data):
        if subject == agent.WORKER_START.subject("b"):
            return msgspec.json.encode(Worker(node="b", endpoint="b:50052"))
        spec = msgspec.json.decode(data, type=ReplicaStart).replica
        return msgspec.json.encode(ReplicaReport(id=spec.id, model="m", profile="cpu", node="a", state="ready"))

    inbox, nats = Inbox(), FakeNats(answer)
    agents = Agents(nats, inbox, Log())
    agents.start(replica(workers=[Worker(node="b")]), MODEL, PROFILE, [])
    items = await drained(agents, inbox)
    assert [type(i) for i in items] == [WorkersUp, ReplicaReport] and items[1].state == "ready"
    (to_worker, _), (to_engine, _) = nats.asked
    assert (to_worker, to_engine) == (agent.WORKER_START.subject("b"), agent.REPLICA_START.subject("a"))


async def test_a_stop_ask_is_logged_once_however_often_it_is_asked_while_in_flight():
    def answer(subject, data):
        return msgspec.json.encode(ReplicaReport(id="ghost", model="m", profile="cpu", node="a", state="stopped"))

    log = Log()
    agents = Agents(FakeNats(answer), Inbox(), log)
    applier = Applier(None, agents, {}, Policy(), log)  # asks alone touch no record
    ask = AgentStop(node="a", id="ghost", reason="replaced while its node was lost")
    await applier.carry_out(Plan(asks=[ask]))
    await applier.carry_out(Plan(asks=[ask]))  # the next heartbeat, while the first is in flight
    await drained(agents, Inbox())
    assert [event for _, event, _ in log.lines] == ["asking an agent to stop"]
