"""Plans applied tick by tick, as the scheduler's shell and the agents would apply them."""

import msgspec


def simulate(plan_for, replicas, start, ticks=40):
    """`plan_for(replicas, now)` gives each tick's plan; a started replica is ready a tick later.

    Returns the ready count seen after every tick and the replicas at the end.
    """
    ready_seen = []
    for tick in range(ticks):
        now = start + tick
        replicas = [msgspec.structs.replace(r, state="ready") if r.state == "pending" else r for r in replicas]
        plan = plan_for(replicas, now)
        stopped = {s.replica.id for s in plan.stops}
        replicas = [r for r in replicas if r.id not in stopped] + [s.replica for s in plan.starts]
        ready_seen.append(sum(r.state == "ready" for r in replicas))
        if not plan.starts and not plan.stops:
            break
    return ready_seen, replicas
