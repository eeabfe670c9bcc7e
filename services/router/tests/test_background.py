"""Work the router does off the hot path (telling the limit counters a request ended, telling
the scheduler a model is wanted): a failure is logged, never swallowed."""

import asyncio

from structlog.testing import capture_logs

from llmgw.proto import Limits, Model, Scaling
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.routing.demand import DemandSignal


class Unreachable:
    """Limit counters and a demand bucket whose NATS never answers."""

    def finish_leased(self, scopes, tokens, now, reserve=0):
        return scopes  # no lease held: every end is left to write

    async def finish(self, scopes, tokens, now, reserve=0):
        raise TimeoutError("nats: timeout")

    async def put(self, key, value):
        raise TimeoutError("nats: timeout")


async def ended(tasks: set[asyncio.Task]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)  # their done callbacks


async def test_a_request_whose_end_the_limit_counters_did_not_hear_is_logged():
    accounts = Accounts(js=None, keys=None, projects=None, quota=Unreachable())
    with capture_logs() as logs:
        accounts.ended([("key.k", "key 'k'", Limits(concurrent=1))], 0, 5, 0.0, None)
        await ended(accounts.tasks)
    [failed] = [e for e in logs if e["log_level"] == "error"]
    assert "limit counters" in failed["what"] and failed["error"] == "TimeoutError: nats: timeout"
    assert not accounts.tasks


async def test_a_demand_the_scheduler_did_not_hear_is_logged():
    demand = DemandSignal(Unreachable(), directory=None, every_s=5.0, wake_timeout_s=1.0, replace_wait_s=1.0)
    sleepy = Model(name="sleepy", source="o/r/m.gguf", scaling=Scaling(min=0, max=1, idle_timeout_s=60))
    with capture_logs() as logs:
        demand.tell(sleepy, 100.0)
        await ended(demand.tasks)
    [failed] = [e for e in logs if e["log_level"] == "error"]
    assert "sleepy" in failed["what"] and "TimeoutError" in failed["error"]
