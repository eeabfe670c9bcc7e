"""The console's stack for its tests: a real nats-server (with authorization on), a mirror holding a
tiny GGUF (imported and verified; the Hub played by the local stand-in), the catalog, a scheduler
with CPU nodes registered as agents would, and the router serving /console. `Browserless` posts the
console's forms as a browser with JavaScript off would (cookies kept, CSRF token read off the page).
"""

from __future__ import annotations

import re
from html import unescape

import httpx
import pytest

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import people
from llmgw.proto.people import Tenant, UserCreate
from llmgw.router.service import Router
from llmgw.scheduler.service import Scheduler
from tests.fleets import serve_router


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


PASSWORD = "correct horse battery staple"
"""The password of the users the tests make."""


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

    async def user_signed_in(self, name: str, tenant: str, role: str) -> Browserless:
        """A local user made in `tenant` (made too) with `role`, signed in with its password."""
        await call(self.nc, people.TENANT_PUT, Tenant(name=tenant, by="t"))
        await call(
            self.nc, people.USER_CREATE, UserCreate(name=name, tenant=tenant, role=role, password=PASSWORD, by="t")
        )
        browser = self.browser()
        form = {"csrf": csrf_of((await browser.get("/console/signin")).text), "name": name, "password": PASSWORD}
        await browser.http.post("/console/signin", data={**form, "next": ""})
        return browser


@pytest.fixture
async def stack(serve, nc, tmp_path, hub):
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    served = await serve_router(serve, nc, tmp_path, tiny, hub, scheduler=True)
    return Stack(nc, served.router, served.admin_key, served.user_key, served.scheduler)
