"""The console's serve form with JavaScript off (a plain HTTP client posting it) against a real
router, mirror, catalog and scheduler over a real nats-server, fake CPU nodes registered as agents
would: the ways shown are the catalog's plan as its API answers it, Recompute and the plan part
ask it again, a very slow way is refused until "run on the CPU anyway" is ticked, and every bad
value is refused on the form, its values kept (escaped), the catalog untouched."""

from html import escape
from urllib.parse import quote

from llmgw.bus import call
from llmgw.proto import Empty, ModelRef, catalog, scheduler
from llmgw.proto.catalog import ServePlan, ServePlanAsk, ServeWay
from tests.console.test_console_house import check_accessible
from tests.fleets import SOURCE, cpu_node

FORM = f"/console/serve?source={quote(SOURCE)}"


async def plan_of(stack, **ask) -> ServePlan:
    """The plan as the catalog's API answers it."""
    return await call(stack.nc, catalog.SERVE_PLAN, ServePlanAsk(source=SOURCE, **ask), timeout=30)


def speed(way: ServeWay) -> str:
    """A way's tokens a second as the form shows it."""
    return f"{way.tokens_per_s:,.{1 if way.tokens_per_s >= 1 else 2}f} tokens/s"


async def models(stack) -> list[str]:
    return [e.model.name for e in (await call(stack.nc, catalog.MODEL_LIST, Empty())).models]


async def test_the_form_shows_the_catalogs_plan_recomputes_it_and_serves_the_way_chosen(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    [way] = (await plan_of(stack, cores=2)).ways
    browser = await stack.signed_in()
    form = await browser.page(f"{FORM}&cores=2")
    assert form.status_code == 200, form.text
    assert f'<data value="{way.tokens_per_s}">{speed(way)}</data>' in form.text
    assert "CPU, 2 thread(s)" in form.text and f"{way.memory_mb} MiB of host memory" in form.text
    assert f'<td class="num">{way.more_replicas}</td>' in form.text and "<td>a</td>" in form.text
    assert 'value="cpu" data-anyway="0" checked' in form.text and '<p id="serve-anyway" hidden>' in form.text
    check_accessible("/console/serve", form.text)
    turkish = await browser.get(f"/console/lang?to=tr&next={quote(FORM + '&cores=2', safe='')}")
    assert "Çalıştırma yolları" in turkish.text and "2 iş parçacığı" in turkish.text
    check_accessible("/console/serve (tr)", turkish.text)
    await browser.get("/console/lang?to=en&next=/console/mirror")

    again = await browser.post("/console/serve", {"source": SOURCE, "cores": "4", "context": "2048", "recompute": "1"})
    assert again.status_code == 200 and again.url.params["cores"] == "4" and "csrf" not in again.url.params
    [wider] = (await plan_of(stack, cores=4, context=2048)).ways
    assert f'<data value="{wider.tokens_per_s}">{speed(wider)}</data>' in again.text
    assert "Sized for a context of 2,048 tokens shared by 2 slot(s)." in again.text
    assert 'id="serve-cores" name="cores" type="number" min="0" max="1024" value="4"' in again.text

    part = await browser.get(f"/console/serve/plan?source={quote(SOURCE)}&cores=4&context=2048&way=cpu")
    assert part.status_code == 200 and "<html" not in part.text and "<form" not in part.text
    assert f'<data value="{wider.tokens_per_s}">{speed(wider)}</data>' in part.text
    refused = await browser.get(f"/console/serve/plan?source={quote(SOURCE)}&cores=99")
    assert refused.status_code == 400 and "the most any node has is 4" in refused.text

    served = await browser.http.post(
        "/console/serve",
        data={"csrf": browser.csrf, "source": SOURCE, "name": "tiny-a", "way": "cpu", "cores": "2", "slots": "2"},
        follow_redirects=False,
    )
    assert served.status_code == 303 and served.headers["location"] == "/console/models/tiny-a"
    stored = (await call(stack.nc, catalog.MODEL_GET, ModelRef(name="tiny-a"))).model
    [profile] = stored.profiles
    assert (profile.name, profile.cpu_cores, profile.host_memory_mb) == ("cpu", 2, way.memory_mb)
    assert stored.context == (await plan_of(stack, cores=2)).context
    mirror = await browser.page("/console/mirror")
    assert "Serving tiny-a: the scheduler starts its replica" in mirror.text
    assert '<a href="/console/models/tiny-a">tiny-a</a>' in mirror.text


async def test_a_very_slow_way_is_refused_until_run_on_the_cpu_anyway_is_ticked(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("slow", 0.001))
    [way] = (await plan_of(stack)).ways
    assert way.mark == "very slow"
    browser = await stack.signed_in()
    form = await browser.page(FORM)
    assert 'value="cpu" data-anyway="1" checked' in form.text and '<p id="serve-anyway">' in form.text
    minutes = f"about {round(way.reply_500_s / 60)} minutes"
    assert f"very slow: a 500-token reply takes {minutes}" in form.text and speed(way) in form.text
    fields = {"source": SOURCE, "name": "slowpoke", "way": "cpu", "context": "", "cores": "", "slots": "2"}
    refused = await browser.post("/console/serve", fields)
    assert refused.status_code == 400 and "Not served:" in refused.text
    assert f"would answer at about {way.tokens_per_s:.1f} tokens a second on the CPU, at best on slow" in refused.text
    assert 'value="slowpoke"' in refused.text and '<p id="serve-anyway">' in refused.text
    assert await models(stack) == []
    ticked = {"csrf": browser.csrf, **fields, "cpu_anyway": "1"}
    taken = await browser.http.post("/console/serve", data=ticked, follow_redirects=False)
    assert taken.status_code == 303 and taken.headers["location"] == "/console/models/slowpoke"
    assert await models(stack) == ["slowpoke"]
    note = (await browser.get("/console/mirror")).text
    assert "Serving slowpoke" in note and "Taken knowingly: Very slow: about" in note


async def test_a_judge_is_served_from_the_form_on_a_cpu_too_slow_for_chat_its_verdict_said(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("slow", 0.001))
    [way] = (await plan_of(stack, judge=True)).ways
    assert way.verdict_s > 0
    browser = await stack.signed_in()
    part = await browser.get(f"/console/serve/plan?source={quote(SOURCE)}&judge=1")
    assert f"a verdict in {way.verdict_s:,.2f} s (reads ~{way.prefill_tokens_per_s:,.0f} tok/s)" in part.text
    assert "a verdict in" not in (await browser.get(f"/console/serve/plan?source={quote(SOURCE)}")).text
    fields = {"csrf": browser.csrf, "source": SOURCE, "name": "guard", "way": "cpu", "slots": "2", "judge": "1"}
    taken = await browser.http.post("/console/serve", data=fields, follow_redirects=False)
    assert taken.status_code == 303, taken.text  # no "run on the CPU anyway" for a judge
    stored = (await call(stack.nc, catalog.MODEL_GET, ModelRef(name="guard"))).model
    assert stored.judge


BAD = [
    ({"cores": "99"}, 400, "cores 99 is above every node&#39;s"),
    ({"cores": "-1"}, 400, "CPU cores: &#39;-1&#39; is not allowed"),
    ({"context": "lots"}, 400, "Context (tokens): &#39;lots&#39; is not allowed"),
    ({"context": "99999999"}, 400, "from 0 to 2097152"),
    ({"slots": "0"}, 400, "Slots (requests at once): &#39;0&#39; is not allowed"),
    ({"way": "gpus-x"}, 400, "&#39;gpus-x&#39; is not one of the ways listed"),
    ({"way": "gpus-1"}, 400, "--gpus 1: no node of this fleet has a card"),
    ({"name": "<b>x</b>"}, 400, f"&#39;{escape('<b>x</b>')}&#39; is not a model name"),
    ({"name": "taken"}, 409, "already exists"),
]
"""Values the form is refused for: (fields, status, what the page says); one stack for them all."""


async def test_bad_values_are_refused_on_the_form_kept_escaped_and_the_catalog_untouched(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    await call(stack.nc, catalog.SERVE, catalog.ServeModel(source=SOURCE, name="taken", cpu=True), timeout=30)
    browser = await stack.signed_in()
    await browser.page(FORM)
    for fields, status, said in BAD:
        posted = await browser.post("/console/serve", {"source": SOURCE, "way": "cpu", **fields})
        assert posted.status_code == status and said in posted.text, (fields, posted.text)
        for name, value in fields.items():
            if name != "way":
                assert f'name="{name}" type=' in posted.text and f'value="{escape(value)}"' in posted.text, fields
        assert "<b>x</b>" not in posted.text
    assert await models(stack) == ["taken"]


async def test_a_file_not_on_the_mirror_is_refused_saying_how_to_fetch_it(stack):
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("a", 40.0))
    browser = await stack.signed_in()
    absent = await browser.page(f"/console/serve?source={quote('demo/tiny/absent.gguf')}")
    assert absent.status_code == 400 and "`llmgw ctl mirror add OWNER/REPO` fetches it" in absent.text
    markup = await browser.page(f"/console/serve?source={quote('<script>x</script>')}")
    assert markup.status_code == 400 and "<script>x" not in markup.text
    assert f"&#39;{escape('<script>x</script>')}&#39; is not a file on the mirror" in markup.text
    none = await browser.page("/console/serve")  # from the navigation: the files to choose from
    assert none.status_code == 200 and 'id="serve-files"' in none.text
