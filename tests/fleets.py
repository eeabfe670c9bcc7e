"""What the tests that stand up real services share: a CPU node as its agent registers it, and
a router in front of a mirror holding a tiny GGUF (imported and verified), the catalog and, when
asked, a scheduler, each served over the root conftest's nats-server (`serve`, `nc`)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import NamedTuple

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import call, new_fleet_secret, node_secret, write_secret
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.mirror.imports import Import
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, KeyCreate, NodeInfo, Page, mirror, scheduler
from llmgw.router.service import Router, RouterConfig
from llmgw.scheduler.service import Scheduler, SchedulerConfig

__all__ = ["SOURCE", "Served", "cpu_node", "serve_agent", "serve_router"]

SOURCE = "demo/tiny/tiny.gguf"
"""Where the mirror holds the tiny GGUF."""


def cpu_node(name: str, gbs: float, cpus: int = 4) -> NodeInfo:
    """A CPU node whose agent measured its memory at `gbs` GB/s (all cores and one alike)."""
    return NodeInfo(
        node=name,
        hostname=name,
        cpus=cpus,
        memory_total_mb=8192,
        memory_available_mb=8192,
        engines={"llamacpp": "test"},
        membw_all_gbs=gbs,
        membw_one_gbs=gbs,
    )


class Served(NamedTuple):
    """The router served, an admin key and a user's, and the scheduler (None: not served)."""

    router: Router
    admin_key: str
    user_key: str
    scheduler: Scheduler | None


async def serve_router(
    serve,
    nc,
    tmp_path: Path,
    tiny: Path,
    hub=None,
    scheduler: bool = False,
    also: dict[str, Path] | None = None,
    **router: object,
) -> Served:
    """Serve a mirror importing `tiny` as `SOURCE` (and `also`: source -> file) under
    tmp_path/mirror (the Hub: `hub`'s stand-in, if given), the catalog, a scheduler if asked, and
    a router; return once the router is ready and the imports verified."""
    files = {SOURCE: tiny, **(also or {})}
    config = MirrorConfig(
        root=str(tmp_path / "mirror"),
        keep_free_bytes=0,
        imports=[
            Import(path=str(path), source=source, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
            for source, path in files.items()
        ],
        **({"hub_endpoint": hub.url} if hub else {}),
    )
    await serve(Mirror(config), config)
    await serve(Catalog(CatalogConfig(file_check_s=5.0)), CatalogConfig(file_check_s=5.0))
    placer = await serve(Scheduler(SchedulerConfig(tick_s=0.3)), SchedulerConfig(tick_s=0.3)) if scheduler else None
    secret = tmp_path / "engine-fleet.secret"
    write_secret(secret, new_fleet_secret())
    router_config = RouterConfig(http_port=0, engine_secret=str(secret), **router)
    router = await serve(Router(router_config), router_config)
    admin = await router.accounts.create_key(KeyCreate(name="ops", admin=True))
    user = await router.accounts.create_key(KeyCreate(name="user"))
    wanted = {source.rsplit("/", 1)[0] for source in files}
    for _ in range(200):
        repos = (await call(nc, mirror.REPO_LIST, Empty())).repos
        if router.ready() and len(repos) == len(wanted) and all(r.state == "ready" for r in repos):
            return Served(router, admin.key, user.key, placer)
        await asyncio.sleep(0.05)
    raise AssertionError("the router or the mirror's import never became ready")


async def serve_agent(serve, nc, tmp_path: Path, node: str = "n", ports: str = "23300-23399") -> Agent:
    """An agent for node `node` of the fleet `serve_router` made (its engine secret derived from
    the fleet's), returned once the scheduler has heard of its node."""
    fleet = (tmp_path / "engine-fleet.secret").read_text()
    write_secret(tmp_path / f"engine-{node}.secret", node_secret(fleet, node))
    config = AgentConfig(
        node=node,
        engine_secret=str(tmp_path / f"engine-{node}.secret"),
        data_dir=str(tmp_path / node),
        heartbeat_s=0.5,
        membw_delay_max_s=0.5,
        ports=ports,
    )
    agent = await serve(Agent(config), config)
    for _ in range(100):
        if any(n.node == node for n in (await call(nc, scheduler.NODE_LIST, Page())).nodes):
            return agent
        await asyncio.sleep(0.1)
    raise AssertionError(f"the scheduler never heard of node {node}")
