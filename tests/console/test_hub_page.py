"""The Hugging Face page with JavaScript off, against the real catalog, mirror and scheduler and the
Hub stand-in (`llmgw.hubstandin`): a search lists the GGUF files with the best way each would run
on the registered node, a fetch starts the mirror's pinned fetch, "fetch and serve" goes on to the
serve form for the file; a refused search or fetch says why and changes nothing."""

import asyncio

from llmgw.bus import call
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.proto import Empty, mirror, scheduler
from tests.console.test_console_house import check_accessible
from tests.fleets import cpu_node


async def _published(stack, hub, tmp_path):
    model = write_random_llama(tmp_path / "hub" / "chat.Q8_0.gguf", TinyLlama(tensor_type="Q8_0"))
    commit = hub.add_repo("acme/tiny-chat-GGUF", {"chat.Q8_0.gguf": model, "README.md": b"hello"})
    hub.popularity("acme/tiny-chat-GGUF", downloads=1234, likes=5)
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    return commit


async def test_a_search_shows_each_file_with_its_best_way_here_and_nothing_is_downloaded(stack, hub, tmp_path):
    commit = await _published(stack, hub, tmp_path)
    browser = await stack.signed_in()
    empty = await browser.page("/console/hub")
    assert empty.status_code == 200 and "Hugging Face" in empty.text
    check_accessible("/console/hub", empty.text)
    before = hub.bytes_served
    page = await browser.page("/console/hub?text=tiny+chat")
    assert page.status_code == 200, page.text
    check_accessible("/console/hub?text=tiny+chat", page.text)
    assert "acme/tiny-chat-GGUF" in page.text and "1,234 downloads, 5 likes" in page.text
    assert "chat.Q8_0.gguf" in page.text and "CPU, 2 threads" in page.text and "tokens/s" in page.text
    assert "node-a" in page.text and f'name="commit" value="{commit}"' in page.text
    assert "1 headers read with" in page.text and "nothing downloaded" in page.text
    assert hub.bytes_served - before < (tmp_path / "hub" / "chat.Q8_0.gguf").stat().st_size
    none = await browser.page("/console/hub?text=no+such+thing")
    assert "No GGUF model on" in none.text and "matches that search" in none.text


async def test_fetch_starts_the_pinned_fetch_and_fetch_and_serve_goes_on_to_the_serve_form(stack, hub, tmp_path):
    commit = await _published(stack, hub, tmp_path)
    browser = await stack.signed_in()
    await browser.page("/console/hub?text=tiny+chat")
    form = {"repo": "acme/tiny-chat-GGUF", "commit": commit, "path": "chat.Q8_0.gguf", "serve": "1"}
    done = await browser.post("/console/hub/fetch", form)
    assert done.url.path == "/console/serve", done.text
    source = f"acme/tiny-chat-GGUF@{commit}/chat.Q8_0.gguf"
    assert "The mirror is fetching chat.Q8_0.gguf of acme/tiny-chat-GGUF" in done.text
    assert "Its ways show here once the mirror verified it." in done.text
    for _ in range(100):
        repos = (await call(stack.nc, mirror.REPO_LIST, Empty())).repos
        held = [r for r in repos if r.repo == "acme/tiny-chat-GGUF"]
        if held and held[0].state == "ready":
            break
        await asyncio.sleep(0.1)
    assert held[0].commit == commit and [f.path for f in held[0].files] == ["chat.Q8_0.gguf"]  # that file only
    form_page = await browser.page(f"/console/serve?source={source}")
    assert form_page.status_code == 200 and "CPU" in form_page.text, form_page.text


async def test_a_refused_fetch_or_search_says_why(stack, hub, tmp_path):
    await _published(stack, hub, tmp_path)
    browser = await stack.signed_in()
    await browser.page("/console/hub")
    bad = await browser.post("/console/hub/fetch", {"repo": "not a repo", "commit": "x", "path": "a.gguf"})
    assert bad.status_code == 400 and "is not a file a search listed" in bad.text
    hub.rate_limit(2, retry_after_s=300)
    limited = await browser.page("/console/hub?text=tiny")
    assert limited.status_code == 429 and "rate-limits searches now: try again in 300 s" in limited.text
    hub.clear_faults()
    long = await browser.page("/console/hub?text=" + "x" * 201)
    assert long.status_code == 400 and "Give up to 200 characters" in long.text
