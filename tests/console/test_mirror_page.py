"""The console's mirror page with JavaScript off (a plain HTTP client posting its forms) against a
real router, mirror and catalog over a real nats-server, the Hub played by the local stand-in: the
repos held with each file's size, state and the models serving it; a repo added, followed to ready,
updated and removed; the mirror's refusals shown on the page with the form kept, nothing changed."""

import asyncio
import re
from html import unescape

from markupsafe import escape

from llmgw.bus import call
from llmgw.gguf import write_random_llama
from llmgw.proto import Empty, Model, ModelPut, catalog, mirror
from tests.fleets import SOURCE


def commit_block(html: str, repo: str, commit: str) -> str:
    """The part of the mirror page that shows `repo` at `commit` (empty: an import)."""
    found = re.search(rf'<div class="commit" id="commit-{re.escape(repo)}@{commit}">(.*?)\n</div>', html, re.S)
    assert found, f"the page does not show {repo}@{commit}"
    return found.group(1)


async def held(stack) -> list[tuple[str, str]]:
    return [(r.repo, r.commit) for r in (await call(stack.nc, mirror.REPO_LIST, Empty())).repos]


async def test_the_page_lists_the_demo_file_ready_with_its_size_the_models_serving_it_and_a_serve_link(stack):
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE)))
    [demo] = (await call(stack.nc, mirror.REPO_LIST, Empty())).repos
    browser = await stack.signed_in()
    page = await browser.page("/console/mirror")
    assert page.status_code == 200 and "<h3>demo/tiny</h3>" in page.text
    block = commit_block(page.text, "demo/tiny", "")
    [file] = demo.files
    assert '<span class="state state-ready">ready</span>' in block and "<code>tiny.gguf</code>" in block
    assert 1e3 <= file.size < 1e6 and f'<data value="{file.size}">{file.size / 1e3:.1f} kB</data>' in block
    assert '<a href="/console/models/tiny">tiny</a>' in block
    assert '<a href="/console/serve?source=demo/tiny/tiny.gguf"' in block
    assert "<progress" not in block  # nothing is being fetched
    turkish = await browser.get("/console/lang?to=tr&next=/console/mirror")
    assert "Aynadaki depolar" in turkish.text and "hazır" in commit_block(turkish.text, "demo/tiny", "")


async def _until(browser, repo: str, commit: str, state: str) -> str:
    for _ in range(300):
        block = commit_block((await browser.page("/console/mirror")).text, repo, commit)
        if f'class="state state-{state}"' in block or 'class="state state-failed"' in block:
            return block
        await asyncio.sleep(0.1)
    raise AssertionError(f"{repo}@{commit} never became {state}: {block}")


async def test_a_repo_added_is_followed_to_ready_updated_when_its_branch_moves_and_a_commit_removed(
    stack, hub, tmp_path
):
    weights = write_random_llama(tmp_path / "m.gguf")
    first = hub.add_repo("org/m", {"m.gguf": weights, "model.pt": b"x" * 10})
    hub.throttle(weights.stat().st_size)  # about a second: the page shows it on its way
    browser = await stack.signed_in()
    await browser.page("/console/mirror")
    added = await browser.post("/console/mirror", {"repo": "org/m", "revision": "main", "include": ""})
    assert added.url.path == "/console/mirror" and added.status_code == 200
    assert f"Queued org/m at {first[:12]}: 1 file(s)" in added.text
    on_its_way = commit_block(added.text, "org/m", first)
    assert "<progress" in on_its_way and f"of {weights.stat().st_size / 1e3:.1f} kB" in on_its_way
    hub.throttle(None)
    ready = await _until(browser, "org/m", first, "ready")
    assert '<span class="state state-ready">ready</span>' in ready, ready
    assert f'href="/console/serve?source=org/m%40{first}/m.gguf"' in ready
    assert "<code>model.pt</code>: " in ready and "<progress" not in ready  # left out, and why

    second = hub.add_repo("org/m", {"m.gguf": weights.read_bytes()[:-1] + b"\1"})
    updated = await browser.post("/console/mirror/update", {"repo": "org/m"})
    assert f"Queued org/m at {second[:12]}" in updated.text
    await _until(browser, "org/m", second, "ready")
    removed = await browser.post("/console/mirror/remove", {"repo": "org/m", "commit": first})
    assert f"Removed from the mirror: org/m at {first[:12]} (1 file(s)" in removed.text
    assert await held(stack) == [("demo/tiny", ""), ("org/m", second)]


async def test_a_bad_repo_name_an_unknown_repo_and_a_gated_one_are_shown_on_the_page_with_the_form_kept(stack, hub):
    hub.add_repo("org/gated", {"m.gguf": b"GGUF" + bytes(100)}, gated=True, token="hf_x")
    browser = await stack.signed_in()
    await browser.page("/console/mirror")
    bad = await browser.post("/console/mirror", {"repo": "not a repo", "revision": "main", "include": "*.gguf"})
    assert bad.status_code == 400 and "'not a repo' is not a Hugging Face repo: write OWNER/NAME" in unescape(bad.text)
    assert 'value="not a repo"' in bad.text and 'value="*.gguf"' in bad.text
    revision = await browser.post("/console/mirror", {"repo": "org/m", "revision": "-x"})
    assert revision.status_code == 400 and "'-x' is not a revision" in unescape(revision.text)
    unknown = await browser.post("/console/mirror", {"repo": "org/nothing", "revision": "v2"})
    assert unknown.status_code == 404 and "The repo was not added:" in unknown.text
    assert f"{hub.url} has no repo org/nothing" in unknown.text and 'value="v2"' in unknown.text
    gated = await browser.post("/console/mirror", {"repo": "org/gated"})
    assert gated.status_code == 400 and "org/gated is gated: accept its licence" in unescape(gated.text)
    markup = await browser.post("/console/mirror", {"repo": "<b>x</b>", "include": '"><script>'})
    assert markup.status_code == 400 and "<b>x</b>" not in markup.text and "<script>" not in markup.text
    assert escape("'<b>x</b>' is not a Hugging Face repo") in markup.text
    assert f'value="{escape(chr(34) + "><script>")}"' in markup.text
    update = await browser.post("/console/mirror/update", {"repo": "demo/tiny"})
    assert update.status_code == 400 and "The repo was not updated:" in update.text
    assert await held(stack) == [("demo/tiny", "")]


async def test_a_repo_a_model_uses_is_not_removed_and_the_page_names_the_model(stack):
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE)))
    browser = await stack.signed_in()
    page = await browser.page("/console/mirror")
    assert 'data-confirm="Delete every file of demo/tiny from the mirror (1 commit(s) held)?' in page.text
    refused = await browser.post("/console/mirror/remove", {"repo": "demo/tiny"})
    assert refused.status_code == 409 and "Nothing was removed:" in refused.text
    assert "demo/tiny is used by tiny (demo/tiny/tiny.gguf): point those models elsewhere" in refused.text
    assert await held(stack) == [("demo/tiny", "")]
    forged = await browser.post("/console/mirror/remove", {"repo": "demo/tiny", "commit": "main"})
    assert forged.status_code == 400 and "names no mirrored repo" in forged.text
    await call(stack.nc, catalog.MODEL_REMOVE, catalog.ModelRef(name="tiny"))
    removed = await browser.post("/console/mirror/remove", {"repo": "demo/tiny"})
    assert removed.status_code == 200 and "Removed from the mirror: demo/tiny at — (1 file(s)" in removed.text
    assert await held(stack) == [] and "The mirror holds no repo yet" in removed.text
