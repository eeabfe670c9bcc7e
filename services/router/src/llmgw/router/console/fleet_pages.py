"""The fleet page: every node the scheduler knows, as its agent last reported it (cards, memory
and its read rate, the CPU calibration, engines, labels, its release and upgrade), the replicas on it, and whether it is
ready, suspect or lost as the scheduler judges it (`NodeList.health`: its own rule, which leaves
out the time it could not hear; the router's clock plays no part)."""

from __future__ import annotations

from typing import NamedTuple

from litestar import get
from litestar.response import Response

from llmgw.bus import call_all
from llmgw.proto import CpuCalibration, Empty, NodeHealth, NodeInfo, ReplicaState, scheduler
from llmgw.proto.release import RELEASE_LIST, Release
from llmgw.router.console.web import Refused, View

__all__ = ["ROUTES", "FleetNode"]


class FleetNode(NamedTuple):
    """One node as the page shows it."""

    info: NodeInfo
    health: NodeHealth
    """ready, suspect or lost, and for how long silent, as the scheduler says."""
    calibration: CpuCalibration
    """Its own CPU calibration, or the defaults (`measured` says which)."""
    measured: bool
    replicas: list[ReplicaState]
    """The replicas on it, or spanning it from another node."""
    release: Release | None = None
    """What it runs and how far its upgrade is, as its agent says (None: it did not say)."""


@get("/fleet")
async def fleet_page(view: View) -> Response:
    """Every node, its state and the replicas on it; says so where the scheduler does not answer."""
    try:
        listed = await view.ask(scheduler.NODE_LIST, Empty())
        replicas = (await view.ask(scheduler.REPLICA_LIST, Empty())).replicas
        said = await call_all(view.console.nc, RELEASE_LIST, Empty(), window_s=0.3)
    except Refused as exc:
        return view.render("fleet.html", active="fleet", nodes=None, why=exc.message)
    nodes = [
        FleetNode(
            info=n,
            health=listed.health[n.node],
            calibration=n.cpu_calibration or CpuCalibration(),
            measured=n.cpu_calibration is not None,
            replicas=[r for r in replicas if r.node == n.node or any(w.node == n.node for w in r.workers)],
            release=next((r for r in said if isinstance(r, Release) and r.node == n.node), None),
        )
        for n in listed.nodes
    ]
    return view.render("fleet.html", active="fleet", nodes=nodes, stale_s=listed.stale_s, lost_s=listed.lost_s)


ROUTES = (fleet_page,)
