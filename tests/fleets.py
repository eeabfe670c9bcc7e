"""What the tests that stand up real services share: a CPU node as its agent registers it, and
a router in front of a mirror holding a tiny GGUF (imported and verified), the catalog and, when
asked, a scheduler, each served over the root conftest's nats-server (`serve`, `nc`)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import NamedTuple

from llmgw.bus import call, new_fleet_secret, write_secret
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.mirror.imports import Import
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, KeyCreate, NodeInfo, mirror
from llmgw.router.service import Router, RouterConfig
from llmgw.scheduler.service import Scheduler, SchedulerConfig

__all__ = ["SOURCE", "Served", "cpu_node", "serve_router"]

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
    serve, nc, tmp_path: Path, tiny: Path, hub=None, scheduler: bool = False, **router: object
) -> Served:
    """Serve a mirror importing `tiny` as `SOURCE` (under tmp_path/mirror; the Hub: `hub`'s
    stand-in, if given), the catalog, a scheduler if asked, and a router; return once the router
    is ready and the import verified."""
    sha256 = hashlib.sha256(tiny.read_bytes()).hexdigest()
    config = MirrorConfig(
        root=str(tmp_path / "mirror"),
        keep_free_bytes=0,
        imports=[Import(path=str(tiny), source=SOURCE, sha256=sha256)],
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
    for _ in range(200):
        if router.ready() and [r.state for r in (await call(nc, mirror.REPO_LIST, Empty())).repos] == ["ready"]:
            return Served(router, admin.key, user.key, placer)
        await asyncio.sleep(0.05)
    raise AssertionError("the router or the mirror's import never became ready")
