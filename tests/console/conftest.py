"""The console's stack for its tests: a real nats-server (with authorization on), a mirror holding a
tiny GGUF (imported and verified; the Hub played by the local stand-in), the catalog, a scheduler
with CPU nodes registered as agents would, and the router serving /console. `Browserless` posts the
console's forms as a browser with JavaScript off would (cookies kept, CSRF token read off the page).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from html import unescape

import httpx
import pytest

from llmgw.bus import call, new_fleet_secret, write_secret
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.gguf import write_random_llama
from llmgw.mirror.imports import Import
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, KeyCreate, NodeInfo, mirror
from llmgw.router.service import Router, RouterConfig
from llmgw.scheduler.service import Scheduler, SchedulerConfig

SOURCE = "demo/tiny/tiny.gguf"
"""The tiny model every console test can serve."""


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


class Browserless:
    """A browser with JavaScript off: follows the console's links and posts its forms."""

    def __init__(self, base: str) -> None:
        self.http = httpx.AsyncClient(base_url=base, timeout=60, follow_redirects=True)

    async def get(self, path: str) -> httpx.Response:
        return await self.http.get(path)

    async def post(self, path: str, data: dict | None = None, csrf: str | None = None) -> httpx.Response:
        """Post a form (a field given a list is sent once per value); its CSRF token is the one on
        the page last seen, unless given."""
        token = self.csrf if csrf is None else csrf
        return await self.http.post(path, data={"csrf": token, **(data or {})})

    @property
    def csrf(self) -> str:
        return self._csrf

    async def sign_in(self, key: str) -> httpx.Response:
        page = await self.get("/console/signin")
        token = csrf_of(page.text)
        response = await self.http.post("/console/signin", data={"csrf": token, "key": key, "next": "/console/models"})
        self._csrf = csrf_of(response.text)
        return response

    async def page(self, path: str) -> httpx.Response:
        """GET a page and keep its CSRF token for the next post."""
        response = await self.get(path)
        if 'name="csrf"' in response.text:
            self._csrf = csrf_of(response.text)
        return response

    _csrf = ""


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found, "the page has no form with a CSRF token"
    return unescape(found.group(1))


class Stack:
    """The services and the router's URL, an admin key and a user's."""

    def __init__(self, nc, router: Router, admin_key: str, user_key: str, scheduler: Scheduler) -> None:
        self.nc, self.router, self.scheduler = nc, router, scheduler
        self.url = router.http.url
        self.admin_key, self.user_key = admin_key, user_key

    def browser(self) -> Browserless:
        return Browserless(self.url)

    async def signed_in(self) -> Browserless:
        browser = self.browser()
        response = await browser.sign_in(self.admin_key)
        assert response.status_code == 200, response.text
        return browser


@pytest.fixture
async def stack(serve, nc, tmp_path, hub):
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    sha256 = hashlib.sha256(tiny.read_bytes()).hexdigest()
    config = MirrorConfig(
        root=str(tmp_path / "mirror"),
        hub_endpoint=hub.url,
        keep_free_bytes=0,
        imports=[Import(path=str(tiny), source=SOURCE, sha256=sha256)],
    )
    await serve(Mirror(config), config)
    await serve(Catalog(CatalogConfig(file_check_s=5.0)), CatalogConfig(file_check_s=5.0))
    scheduler = await serve(Scheduler(SchedulerConfig(tick_s=0.3)), SchedulerConfig(tick_s=0.3))
    secret = tmp_path / "engine-fleet.secret"
    write_secret(secret, new_fleet_secret())
    router_config = RouterConfig(http_port=0, engine_secret=str(secret))
    router = await serve(Router(router_config), router_config)
    admin = await router.accounts.create_key(KeyCreate(name="ops", admin=True))
    user = await router.accounts.create_key(KeyCreate(name="user"))
    for _ in range(200):
        if router.ready() and [r.state for r in (await call(nc, mirror.REPO_LIST, Empty())).repos] == ["ready"]:
            return Stack(nc, router, admin.key, user.key, scheduler)
        await asyncio.sleep(0.05)
    raise AssertionError("the router or the mirror's import never became ready")
