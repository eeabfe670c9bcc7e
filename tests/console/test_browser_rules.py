"""The serve form's rule in a real Chromium, on a fleet this machine cannot be: one node whose memory
reads at 1 MB/s (registered as its agent would; a stand-in for a slow machine). The real catalog,
mirror, scheduler and router run in this process (tests/console/conftest.py's `stack`); the browser
is driven from a thread so they keep answering. The very slow way is marked as the API's plan marks
it, the "run on the CPU anyway" box shows for it, the catalog's refusal is shown in the form until the
box is ticked, and ticking it serves the model."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.bus import call
from llmgw.proto import Empty, ModelRef, catalog, scheduler
from llmgw.proto.catalog import ServePlanAsk
from tests.console.chromium_driver import Chromium
from tests.fleets import SOURCE, cpu_node


@pytest.fixture
async def signed_in(stack):
    """A Chromium signed in to the stack's console (opened in a thread: the services run here)."""
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("slow-box", 0.001))
    browser = await asyncio.to_thread(Chromium, stack.url)

    def sign_in():
        browser.open("/console/signin")
        browser.fill("#key", stack.admin_key)
        browser.find("#signin-key button[type=submit]").click()
        browser.wait_for(lambda: browser.path == "/console/models")

    await asyncio.to_thread(sign_in)
    yield browser
    await asyncio.to_thread(browser.quit)


async def test_a_very_slow_way_is_refused_in_the_form_until_the_box_is_ticked(stack, signed_in):
    browser = signed_in
    plan = await call(stack.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE), timeout=30)
    [way] = plan.ways
    assert (way.kind, way.mark, way.node) == ("cpu", "very slow", "slow-box")

    def refused():
        browser.open(f"/console/serve?source={SOURCE}")
        browser.fill("#serve-name", "crawl")
        marked = browser.find("#serve-plan .mark-very-slow").text
        assert browser.find("#serve-anyway").is_displayed()
        browser.shot("serve-very-slow")
        browser.find("#serve-form > button[type=submit]").click()
        browser.wait_for(lambda: browser.all("#serve-error"))
        browser.shot("serve-refused")
        return marked, browser.find("#serve-error").text, browser.find("#serve-name").get_attribute("value")

    marked, error, kept = await asyncio.to_thread(refused)
    minutes = round(way.reply_500_s / 60)
    assert "very slow" in marked and f"{minutes:,}" in marked, marked
    assert "cpu_anyway" in error or "anyway" in error, error
    assert kept == "crawl"
    assert (await call(stack.nc, catalog.MODEL_LIST, Empty())).models == []

    def ticked():
        browser.find("input[name=cpu_anyway]").click()
        browser.find("#serve-form > button[type=submit]").click()
        browser.wait_for(lambda: browser.path == "/console/models/crawl")
        browser.shot("model-card-very-slow")
        return browser.text()

    card = await asyncio.to_thread(ticked)
    assert "crawl" in card
    entry = await call(stack.nc, catalog.MODEL_GET, ModelRef(name="crawl"))
    assert entry.model.profiles[0].gpus == 0 and entry.warnings == []
