"""A served model's card with JavaScript off (a plain HTTP client posting its forms) against the real
catalog and scheduler: what it shows (its state and replicas as the scheduler reports them, its
settings and profiles, the CPU's speed from the serve plan), every action and the note after it,
and bad input: numbers out of range, a revision the model moved past, an unknown model, markup in
free text, a model declared in a file, a user's key. Nothing refused changes the catalog."""

import re

import msgspec
import pytest

from llmgw.bus import NotFound, call
from llmgw.proto import BUCKETS, CatalogRecord, Model, ModelPut, ModelRef, Profile, Scaling, catalog, scheduler
from llmgw.proto.bounds import MOST_CONTEXT
from llmgw.proto.catalog import LEAST_CONTEXT, SetOwner
from llmgw.proto.scheduler import RoomAsk
from tests.console.test_console_house import check_accessible
from tests.fleets import SOURCE, cpu_node


async def put(stack, name="tiny", **fields):
    model = Model(name=name, source=SOURCE, **fields)
    return await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=model, by="tester"))


async def get(stack, name="tiny"):
    return await call(stack.nc, catalog.MODEL_GET, ModelRef(name=name))


def revision_on(html: str) -> str:
    found = re.search(r'name="revision" value="(\d+)"', html)
    assert found, "the card has no form with the revision"
    return found.group(1)


async def card(stack, name="tiny"):
    """A signed-in browser on the card, and the revision its forms carry."""
    browser = await stack.signed_in()
    page = await browser.page(f"/console/models/{name}")
    assert page.status_code == 200, page.text
    return browser, page


async def test_the_card_shows_state_replicas_settings_profiles_and_the_cpus_speed(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    await put(stack, context=2048, max_output=512, owner="team-x", aliases=["tiny-chat"])
    browser = await stack.signed_in()
    for _ in range(100):  # the scheduler places it on node-a; no agent answers there, so it fails
        page = await browser.page("/console/models/tiny")
        if "node-a" in page.text and "nobody answers" in page.text:
            break
    assert "2,048 tokens" in page.text and "512 tokens" in page.text
    assert "team-x" in page.text and "tiny-chat" in page.text and "by tester" in page.text
    assert "On CPUs (cpu)" in page.text and SOURCE in page.text
    assert re.search(r"reckoned, — measured", page.text)  # the scheduler's estimate, nothing measured
    speed = re.search(r"about ([\d,.]+) tokens a second for one reply, at best on node-a", page.text)
    assert speed, page.text
    assert f'value="{(await get(stack)).revision}"' in page.text
    assert 'id="model-state" data-live' in page.text
    check_accessible("/console/models/tiny", page.text)
    await browser.get("/console/lang?to=tr&next=/console/models/tiny")
    turkish = await browser.page("/console/models/tiny")
    assert (
        '<html lang="tr">' in turkish.text and "2.048 token" in turkish.text and "Dosyalarıyla kaldır" in turkish.text
    )
    check_accessible("/console/models/tiny (tr)", turkish.text)
    listed = await browser.page("/console/models")
    assert 'href="/console/models/tiny"' in listed.text and "team-x" in listed.text


async def test_markup_in_the_owner_and_a_name_is_shown_as_text(stack):
    entry = await put(stack)
    await call(
        stack.nc, catalog.MODEL_CHANGE, SetOwner(name="tiny", owner="<script>x</script>", revision=entry.revision)
    )
    browser, page = await card(stack)
    assert "<script>x</script>" not in page.text and "&lt;script&gt;x&lt;/script&gt;" in page.text
    listed = await browser.page("/console/models")
    assert "<script>x</script>" not in listed.text and "&lt;script&gt;" in listed.text
    marked = await browser.page("/console/models/%3Cb%3Ex")
    assert marked.status_code == 404 and "&lt;b&gt;x" in marked.text and "<b>x" not in marked.text


async def test_stop_then_start_say_what_changed_and_what_happens_next(stack):
    await put(stack)
    browser, page = await card(stack)
    assert 'data-confirm="Stop tiny? Its replicas stop' in page.text
    stopped = await browser.post("/console/models/tiny/stop", {"revision": revision_on(page.text)})
    assert stopped.status_code == 200 and stopped.url.path == "/console/models/tiny"
    assert (
        "tiny is stopped: its replicas stop; it is kept, with its files, and Start runs it again as it was"
        in stopped.text
    )
    assert (await get(stack)).model.stopped is not None
    assert ">Start</button>" in stopped.text and "/console/models/tiny/stop" not in stopped.text
    started = await browser.post("/console/models/tiny/start", {"revision": revision_on(stopped.text)})
    assert "tiny is started again, as it was: the scheduler brings back 1 replica." in started.text
    assert (await get(stack)).model.stopped is None


async def test_restart_starts_a_new_generation(stack):
    await put(stack, profiles=[Profile(replicas=2)], scaling=Scaling(min=2, max=2))
    browser, page = await card(stack)
    assert "Start each of tiny&#39;s replicas again, one at a time?" in page.text
    done = await browser.post("/console/models/tiny/restart", {"revision": revision_on(page.text)})
    assert "tiny: 2 replicas starting again, one at a time" in done.text
    assert (await get(stack)).model.generation == 1


async def test_replicas_per_profile_also_on_cpus_and_cards_a_replica(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    await put(stack, profiles=[Profile(name="gpu", gpus=1)])
    browser, page = await card(stack)
    assert "Also on CPUs" in page.text and "at best on node-a" in page.text
    memory = re.search(r'name="cpu_memory_mb" value="(\d+)"', page.text).group(1)
    assert int(memory) > 0  # the serve plan's memory for a CPU replica
    form = {"revision": revision_on(page.text), "replicas.gpu": "2", "cpu_replicas": "1", "cpu_memory_mb": memory}
    done = await browser.post("/console/models/tiny/replicas", form)
    assert done.url.path == "/console/models/tiny", done.text
    assert "tiny runs 2 on gpu, 1 on cpu: those short start first, then those over stop." in done.text
    model = (await get(stack)).model
    assert {p.name: (p.replicas, p.gpus) for p in model.profiles} == {"gpu": (2, 1), "cpu": (1, 0)}
    assert model.profiles[1].host_memory_mb == int(memory)
    assert "Also on CPUs" not in done.text  # it has a CPU profile now
    spread = await browser.post("/console/models/tiny/gpus", {"revision": revision_on(done.text), "gpus.gpu": "2"})
    assert "tiny: cards a replica on gpu: 2; 3 replicas starting again, one at a time." in spread.text
    assert (await get(stack)).model.profiles[0].gpus == 2


async def test_also_on_cpus_is_offered_where_the_catalogs_serve_plan_has_a_cpu_way(stack):
    await put(stack, profiles=[Profile(name="gpu", gpus=1)])
    browser, page = await card(stack)
    assert 'name="cpu_replicas"' not in page.text and "no node has registered with the scheduler" in page.text
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    page = await browser.page("/console/models/tiny")
    assert 'name="cpu_replicas"' in page.text and "at best on node-a" in page.text
    safe = Model(name="safe", source="o/r/model.safetensors", profiles=[Profile(name="gpu", gpus=1, engine="vllm")])
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=safe, by="tester"))
    other = await browser.page("/console/models/safe")  # the plan's words say why not: it is no GGUF file
    assert 'name="cpu_replicas"' not in other.text and "is not a .gguf file" in other.text


async def test_also_on_cpus_posted_is_asked_of_the_catalog_which_refuses_in_its_own_words(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    before = await put(stack, profiles=[Profile(name="gpu", gpus=1), Profile(name="cpu", host_memory_mb=512)])
    browser, page = await card(stack)
    assert 'name="cpu_replicas"' not in page.text  # it has a CPU profile
    form = {"revision": revision_on(page.text), "cpu_replicas": "1", "cpu_memory_mb": "512"}
    refused = await browser.post("/console/models/tiny/replicas", form)
    assert refused.status_code == 400 and "already has a CPU profile &#39;cpu&#39;" in refused.text
    await put(stack, "other", profiles=[Profile(name="gpu", gpus=1, engine="vllm")])
    page = await browser.page("/console/models/other")
    form = {"revision": revision_on(page.text), "cpu_replicas": "1", "cpu_memory_mb": "512"}
    refused = await browser.post("/console/models/other/replicas", form)
    assert refused.status_code == 400 and "served by vllm, not llama.cpp" in refused.text
    assert (await get(stack)).revision == before.revision and len((await get(stack, "other")).model.profiles) == 1


async def test_context_and_longest_answer(stack):
    await put(stack)
    browser, page = await card(stack)
    done = await browser.post(
        "/console/models/tiny/context", {"revision": revision_on(page.text), "context": "2048", "max_output": "256"}
    )
    assert "tiny: a context of 2,048 tokens, longest answer 256; 1 replica starting again on it" in done.text
    model = (await get(stack)).model
    assert (model.context, model.max_output) == (2048, 256)
    answer = await browser.post(
        "/console/models/tiny/context", {"revision": revision_on(done.text), "context": "2048", "max_output": "300"}
    )
    assert "answers of at most 300 tokens, applied at once; no replica starts again" in answer.text
    same = await browser.post(
        "/console/models/tiny/context", {"revision": revision_on(answer.text), "context": "2048", "max_output": "300"}
    )
    assert "Nothing to change" in same.text
    too_long = await browser.post(
        "/console/models/tiny/context", {"revision": revision_on(same.text), "context": "2048", "max_output": "4000"}
    )
    assert too_long.status_code == 400 and "max_output 4000 does not fit in context 2048" in too_long.text


async def test_a_model_served_with_the_longest_context_the_serve_form_takes_is_changed_from_its_card(stack):
    await put(stack, context=MOST_CONTEXT)
    browser, page = await card(stack)
    assert f'name="context" value="{MOST_CONTEXT}" min="{LEAST_CONTEXT}" max="{MOST_CONTEXT}"' in page.text
    form = {"revision": revision_on(page.text), "context": str(MOST_CONTEXT), "max_output": "1000"}
    done = await browser.post("/console/models/tiny/context", form)
    assert done.status_code == 200 and "answers of at most 1,000 tokens" in done.text, done.text[-600:]
    longer = await browser.post(
        "/console/models/tiny/context", {**form, "revision": revision_on(done.text), "context": str(MOST_CONTEXT + 1)}
    )
    assert longer.status_code == 400 and f"&#39;{MOST_CONTEXT + 1}&#39; is not allowed" in longer.text


@pytest.mark.parametrize(
    ("action", "form", "said"),
    [
        (
            "replicas",
            {"replicas.cpu": "65"},
            "On CPUs (cpu): &#39;65&#39; is not allowed; give a whole number from 0 to 64",
        ),
        ("replicas", {"replicas.cpu": "-1"}, "On CPUs (cpu): &#39;-1&#39; is not allowed"),
        (
            "context",
            {"context": "100"},
            "Context (tokens): &#39;100&#39; is not allowed; give a whole number from 128 to",
        ),
        ("context", {"context": "lots"}, "Context (tokens): &#39;lots&#39; is not allowed"),
        ("context", {"context": "4096", "max_output": "0"}, "Longest answer (tokens): &#39;0&#39; is not allowed"),
    ],
)
async def test_a_number_out_of_range_is_refused_naming_the_field_and_nothing_changes(stack, action, form, said):
    before = await put(stack)
    browser, page = await card(stack)
    refused = await browser.post(f"/console/models/tiny/{action}", {"revision": revision_on(page.text), **form})
    assert refused.status_code == 400 and said in refused.text and "Nothing was changed." in refused.text
    for field, value in form.items():  # the posted value is kept in the form
        assert f'name="{field}" value="{value}"' in refused.text
    assert (await get(stack)).revision == before.revision


async def test_also_on_cpus_out_of_range_refused(stack):
    before = await put(stack, profiles=[Profile(name="gpu", gpus=1)])
    browser, page = await card(stack)
    form = {"revision": revision_on(page.text), "cpu_replicas": "1", "cpu_memory_mb": "0"}
    refused = await browser.post("/console/models/tiny/replicas", form)
    assert refused.status_code == 400 and "Memory a CPU replica reserves (MiB): &#39;0&#39;" in refused.text
    cards = await browser.post("/console/models/tiny/gpus", {"revision": revision_on(page.text), "gpus.gpu": "65"})
    assert cards.status_code == 400 and "Cards a replica of gpu: &#39;65&#39; is not allowed" in cards.text
    assert (await get(stack)).revision == before.revision


async def test_a_form_from_before_a_change_is_a_409_showing_the_model_as_it_is_now(stack):
    await put(stack)
    browser, page = await card(stack)
    drawn = revision_on(page.text)
    await call(stack.nc, catalog.MODEL_CHANGE, SetOwner(name="tiny", owner="team-y", by="someone"))
    for action, form in [("stop", {}), ("context", {"context": "1024"}), ("remove", {}), ("purge", {})]:
        stale = await browser.post(f"/console/models/tiny/{action}", {"revision": drawn, **form})
        assert stale.status_code == 409, (action, stale.text[:300])
        assert "changed since this page was drawn (by someone); nothing was changed" in stale.text
        assert "team-y" in stale.text and revision_on(stale.text) != drawn
    now = await get(stack)
    assert now.model.stopped is None and now.model.context == 4096 and now.revision == int(drawn) + 1


async def test_remove_takes_it_out_of_the_catalog_and_keeps_its_files(stack):
    await put(stack)
    browser, page = await card(stack)
    assert "Take tiny out of the catalog? Its replicas stop; its files stay" in page.text
    done = await browser.post("/console/models/tiny/remove", {"revision": revision_on(page.text)})
    assert done.url.path == "/console/models"
    assert "tiny is out of the catalog: its replicas stop; its files stay on the mirror and the nodes." in done.text
    with pytest.raises(NotFound):
        await get(stack)


async def test_purge_says_what_it_deleted_and_what_it_kept(stack):
    await put(stack)
    browser, page = await card(stack)
    done = await browser.post("/console/models/tiny/purge", {"revision": revision_on(page.text)})
    assert done.url.path == "/console/models", done.text
    assert "tiny is out of the catalog; its files: 1 deleted, 0 kept. Deleted from: mirror." in done.text
    with pytest.raises(NotFound):
        await get(stack)


async def test_purge_keeps_a_file_another_model_uses(stack):
    await put(stack)
    await put(stack, name="twin")
    browser, page = await card(stack)
    done = await browser.post("/console/models/tiny/purge", {"revision": revision_on(page.text)})
    assert "its files: 0 deleted, 1 kept." in done.text and "model twin uses it" in done.text
    assert (await get(stack, "twin")).model.source == SOURCE


async def test_an_unknown_model_or_action_is_a_404_with_the_way_back(stack):
    browser = await stack.signed_in()
    page = await browser.page("/console/models/nope")
    assert page.status_code == 404 and "There is no model called &#39;nope&#39; in the catalog" in page.text
    assert 'href="/console/models"' in page.text
    posted = await browser.post("/console/models/nope/stop", {"revision": "1"})
    assert posted.status_code == 404 and "no model called &#39;nope&#39;" in posted.text
    await put(stack)
    odd = await browser.post("/console/models/tiny/explode", {"revision": "1"})
    assert odd.status_code == 404 and "&#39;explode&#39; is not something a model&#39;s card does" in odd.text


async def test_a_model_declared_in_a_file_says_where_to_change_it(stack):
    kv = await stack.nc.jetstream().key_value(BUCKETS["catalog"])
    record = CatalogRecord(model=Model(name="fixed", source=SOURCE), declared_in="/etc/llmgw/models.yaml")
    await kv.put("fixed", msgspec.json.encode(record))
    browser, page = await card(stack, "fixed")
    assert "declared in /etc/llmgw/models.yaml: change it there and restart the catalog" in page.text
    assert "/console/models/fixed/stop" not in page.text  # no form to change it
    forced = await browser.post("/console/models/fixed/stop", {"revision": str((await get(stack, "fixed")).revision)})
    assert forced.status_code == 400 and "change it there and restart the catalog" in forced.text
    assert (await get(stack, "fixed")).model.stopped is None


async def test_a_user_or_a_forged_form_never_reaches_a_model(stack):
    before = await put(stack)
    user = stack.browser()
    assert (await user.sign_in(stack.user_key)).status_code == 403
    page = await user.get("/console/models/tiny")
    assert page.url.path == "/console/signin"
    posted = await user.http.post("/console/models/tiny/stop", data={"revision": str(before.revision), "csrf": "x"})
    assert posted.status_code == 401
    admin, page = await card(stack)
    forged = await admin.post("/console/models/tiny/stop", {"revision": revision_on(page.text)}, csrf="forged")
    assert forged.status_code == 403
    assert (await get(stack)).revision == before.revision


async def test_in_place_is_offered_on_the_card_where_the_scheduler_advises_it(stack):
    """A rolling change on a small machine parks, advising `--in-place`: the card had no way to ask
    for it. Context, cards, resources, adapters and restart each take it now."""
    await put(stack)
    browser, page = await card(stack)
    assert page.text.count('name="in_place" value="1"') == 4  # context, resources, adapters, restart (no card)
    done = await browser.post(
        "/console/models/tiny/context", {"revision": revision_on(page.text), "context": "1024", "in_place": "1"}
    )
    assert done.status_code == 200 and (await get(stack)).model.rollout == "in-place"
    again = await browser.post("/console/models/tiny/restart", {"revision": revision_on(done.text)})
    assert again.status_code == 200 and (await get(stack)).model.rollout == "surge"


async def test_resources_change_a_profiles_reservation_and_more_than_any_node_has_is_refused(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0, cpus=4))
    before = await put(stack)
    browser, page = await card(stack)
    assert "Resources a replica" in page.text
    too_big = {"revision": revision_on(page.text), "profile": "cpu", "memory_mb": "9000", "cores": ""}
    refused = await browser.post("/console/models/tiny/resources", too_big)
    assert refused.status_code == 400 and "the most is 8.0 GiB on node-a: ask for 8 GiB or less" in refused.text
    assert 'name="memory_mb" value="9000"' in refused.text and (await get(stack)).revision == before.revision
    cores = {**too_big, "memory_mb": "", "cores": "5"}
    refused = await browser.post("/console/models/tiny/resources", cores)
    assert refused.status_code == 400 and "the most is 4 on node-a: ask for 4 or fewer" in refused.text
    done = await browser.post("/console/models/tiny/resources", {**too_big, "memory_mb": "2048", "cores": "2"})
    assert done.url.path == "/console/models/tiny", done.text
    assert "tiny: a replica of cpu reserves 2 cores, 2.0 GiB; 1 replica starting again, one at a time." in done.text
    (profile,) = (await get(stack)).model.profiles
    assert (profile.host_memory_mb, profile.cpu_cores) == (2048, 2)
    same = await browser.post(
        "/console/models/tiny/resources",
        {**too_big, "revision": revision_on(done.text), "memory_mb": "2048", "cores": ""},
    )
    assert "Nothing to change: the values sent are the ones it has." in same.text
    unknown = await browser.post("/console/models/tiny/resources", {**too_big, "profile": "gpu"})
    assert unknown.status_code == 400 and "No profile &#39;gpu&#39;; its profiles: cpu." in unknown.text


async def test_the_replicas_form_says_how_many_more_fit_now_and_through_the_admin_api(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0, cpus=4))
    stopped = {"scaling": Scaling(min=0, max=0), "stopped": Scaling(min=1, max=1)}  # none of its own holds room
    await put(stack, profiles=[Profile(name="cpu", host_memory_mb=2000)], **stopped)
    browser, page = await card(stack)
    assert f"more now: at most {(8192 - 512) // 2000}" in page.text  # the node's memory less the reserve
    room = await call(stack.nc, scheduler.MODEL_ROOM, RoomAsk(name="tiny"))
    assert [(p.profile, p.more_now, p.more_preempting) for p in room.profiles] == [("cpu", 3, 3)]
    with pytest.raises(NotFound, match="no model 'nope' in the catalog"):
        await call(stack.nc, scheduler.MODEL_ROOM, RoomAsk(name="nope"))


async def test_scaling_class_and_owner_are_set_from_the_card(stack):
    before = await put(stack)
    browser, page = await card(stack)
    form = {"revision": revision_on(page.text), "min": "0", "max": "2", "idle_timeout_s": "600"}
    done = await browser.post("/console/models/tiny/scaling", form)
    assert "tiny: 0 to 2 replicas, scaled to zero after 600 s idle" in done.text, done.text
    assert (await get(stack)).model.scaling == Scaling(min=0, max=2, idle_timeout_s=600)
    wrong = await browser.post(
        "/console/models/tiny/scaling", {**form, "revision": revision_on(done.text), "max": "65"}
    )
    assert wrong.status_code == 400 and "Most at once: &#39;65&#39; is not allowed" in wrong.text
    klass = await browser.post(
        "/console/models/tiny/class", {"revision": revision_on(done.text), "capacity_class": "critical"}
    )
    assert "tiny is now critical: it may take room from standard and batch models; nothing restarts." in klass.text
    bad = await browser.post(
        "/console/models/tiny/class", {"revision": revision_on(klass.text), "capacity_class": "vip"}
    )
    assert bad.status_code == 400 and "&#39;vip&#39; is not a capacity class" in bad.text
    owner = await browser.post(
        "/console/models/tiny/owner", {"revision": revision_on(klass.text), "owner": "ml <team>"}
    )
    assert "tiny is now owned by ml &lt;team&gt;; nothing restarts." in owner.text
    after = (await get(stack)).model
    assert (after.capacity_class, after.owner) == ("critical", "ml <team>")
    assert (await get(stack)).revision == before.revision + 3
    await browser.post("/console/models/tiny/stop", {"revision": revision_on(owner.text)})
    stopped = await browser.page("/console/models/tiny")
    assert "Replicas kept running" not in stopped.text  # a new scaling would start it
    refused = await browser.post("/console/models/tiny/scaling", {**form, "revision": revision_on(stopped.text)})
    assert refused.status_code == 409 and "tiny is stopped: a new scaling would start it." in refused.text
    assert (await get(stack)).model.stopped is not None
