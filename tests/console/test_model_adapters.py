"""A model's adapters from its card, JavaScript off, against the real catalog and mirror: attached
(checked against the weights by the mirror), listed as clients ask for them, detached; and bad
input: an adapter made for other weights, a file not on the mirror, a scale out of range."""

import pytest

from llmgw.bus import call
from llmgw.gguf import TinyLlama, write_random_llama, write_random_lora
from llmgw.proto import Model, ModelPut, ModelRef, catalog
from tests.console.conftest import Stack
from tests.console.test_console_house import check_accessible
from tests.console.test_model_card import revision_on
from tests.fleets import SOURCE, serve_router

CHAT, WIDE = "demo/chat-lora/chat.gguf", "demo/wide-lora/wide.gguf"


@pytest.fixture
async def stack(serve, nc, tmp_path, hub):
    """The console's stack with two adapters on the mirror: one for its tiny model, one for a wider one."""
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    wider = write_random_llama(tmp_path / "wider.gguf", TinyLlama(embedding=128))
    also = {CHAT: write_random_lora(tmp_path / "chat.gguf", tiny), WIDE: write_random_lora(tmp_path / "w.gguf", wider)}
    served = await serve_router(serve, nc, tmp_path, tiny, hub, scheduler=True, also=also)
    await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="tester"))
    return Stack(nc, served.router, served.admin_key, served.user_key, served.scheduler)


async def adapters(stack):
    return (await call(stack.nc, catalog.MODEL_GET, ModelRef(name="tiny"))).model.adapters


async def test_an_adapter_is_attached_listed_and_detached_from_the_card(stack):
    browser = await stack.signed_in()
    page = await browser.page("/console/models/tiny")
    assert "No adapter is attached" in page.text
    form = {"revision": revision_on(page.text), "source": CHAT, "adapter": "", "scale": "0.5"}
    done = await browser.post("/console/models/tiny/adapter-add", form)
    assert "tiny: adapter chat attached; its replicas load it one at a time" in done.text, done.text
    assert [(a.name, a.source, a.scale) for a in await adapters(stack)] == [("chat", CHAT, 0.5)]
    assert "<code>tiny:chat</code>" in done.text
    check_accessible("/console/models/tiny (adapters)", done.text)
    gone = await browser.post(
        "/console/models/tiny/adapter-remove", {"revision": revision_on(done.text), "adapter": "chat"}
    )
    assert "tiny: adapter chat detached" in gone.text and await adapters(stack) == []


async def test_an_adapter_that_cannot_be_attached_is_refused_on_the_card_saying_why(stack):
    browser = await stack.signed_in()
    page = await browser.page("/console/models/tiny")
    form = {"revision": revision_on(page.text), "source": WIDE, "adapter": "wide", "scale": "1"}
    wide = await browser.post("/console/models/tiny/adapter-add", form)
    assert wide.status_code == 400 and "wide.gguf was made for another model" in wide.text, wide.text
    missing = await browser.post("/console/models/tiny/adapter-add", {**form, "source": "demo/chat-lora/none.gguf"})
    assert missing.status_code == 400 and "the mirror holds no file &#39;demo/chat-lora/none.gguf&#39;" in missing.text
    scale = await browser.post("/console/models/tiny/adapter-add", {**form, "source": CHAT, "scale": "9"})
    assert scale.status_code == 400 and "at most 4; &#39;9&#39; is not" in scale.text
    odd = await browser.post("/console/models/tiny/adapter-add", {**form, "source": "../etc/passwd"})
    assert odd.status_code == 400 and "is not a file on the mirror" in odd.text
    unknown = await browser.post("/console/models/tiny/adapter-remove", {**form, "adapter": "nope"})
    assert unknown.status_code == 400 and "model &#39;tiny&#39; has no adapter nope; its adapters: none" in unknown.text
    assert await adapters(stack) == []
