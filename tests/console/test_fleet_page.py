"""The fleet page with JavaScript off, against a real scheduler: every node with its memory rate,
cards, calibration, engines, labels and replicas, and whether it is ready, suspect or lost by the
scheduler's own thresholds; what an agent reports is shown as text."""

import asyncio
import re

import msgspec

from llmgw.bus import call
from llmgw.proto import CpuCalibration, Empty, Filesystem, GpuInfo, Model, ModelPut, catalog, scheduler
from tests.fleets import SOURCE, cpu_node


async def _register(stack) -> None:
    card = GpuInfo(
        index=0,
        uuid="GPU-1",
        name="NVIDIA H100",
        cls="h100-80g",
        memory_total_mb=81920,
        memory_used_mb=20480,
        memory_foreign_mb=1024,
    )
    calibrated = msgspec.structs.replace(
        cpu_node("cpu-b", 12.5),
        membw_one_gbs=7.25,
        cpu_calibration=CpuCalibration(source="llama-bench <on> cpu-b", worst_error=0.08),
        labels={"zone": "<b>eu</b>"},
        hostname="<i>host-b</i>",
        gpus=[card],
        filesystems=[
            Filesystem(path="/var/lib/llmgw", total_mb=102400, free_mb=800),  # under 1 GiB: nearly full
            Filesystem(path="/data", total_mb=204800, free_mb=150000),
        ],
    )
    await call(stack.nc, scheduler.NODE_REGISTER, cpu_node("cpu-a", 40.0))
    await call(stack.nc, scheduler.NODE_REGISTER, calibrated)


async def test_every_node_with_its_memory_rate_cards_calibration_and_state(stack):
    await _register(stack)
    browser = await stack.signed_in()
    page = await browser.page("/console/fleet")
    assert page.status_code == 200 and "data-live" in page.text
    a = page.text[page.text.index('id="node-cpu-a"') : page.text.index('id="node-cpu-b"')]
    b = page.text[page.text.index('id="node-cpu-b"') :]
    assert 'data-state="ready"' in a and 'data-state="ready"' in b
    assert '<dd class="membw-all">40.0 GB/s</dd>' in a and '<dd class="membw-one">40.0 GB/s</dd>' in a
    assert '<dd class="membw-all">12.5 GB/s</dd>' in b and '<dd class="membw-one">7.2 GB/s</dd>' in b
    assert "the defaults fitted on another fleet are used" in a and "No card" in a
    assert "Measured on this node: llama-bench &lt;on&gt; cpu-b; largest error 8.0%" in b
    assert "h100-80g" in b and "80.0 GiB" in b and "60.0 GiB" in b and "1.0 GiB" in b  # total, free, others'
    assert "<code>llamacpp</code> test" in a
    assert "zone=&lt;b&gt;eu&lt;/b&gt;" in b and "&lt;i&gt;host-b&lt;/i&gt;" in b
    assert "<b>eu</b>" not in page.text and "<i>host-b</i>" not in page.text
    assert "is suspect (it gets no new replicas); after 30 s it is lost" in page.text  # the scheduler's
    disks = b[b.index('<dd class="disks">') :].split("</dd>", 1)[0].split("<br>")
    assert "<code>/var/lib/llmgw</code> 800 MiB free of 100.0 GiB · nearly full" in disks[0]
    assert 'class="disk mark-slow"' in disks[0] and "nearly full" not in disks[1] and "146.5 GiB free" in disks[1]


async def test_a_node_not_heard_from_is_what_the_scheduler_judges_it_leaving_out_its_deaf_time(stack):
    await _register(stack)
    browser = await stack.signed_in()
    views, deaf = stack.scheduler.nodes, stack.scheduler.hearing.deaf_s
    for n in ("cpu-a", "cpu-b"):  # heard 45 s ago; for cpu-b the scheduler was away from NATS 40 s of it
        views[n] = msgspec.structs.replace(views[n], last_seen=views[n].last_seen - 45, deaf_s=deaf)
    views["cpu-b"].deaf_s -= 40
    page = await browser.page("/console/fleet")
    a = page.text[page.text.index('id="node-cpu-a"') : page.text.index('id="node-cpu-b"')]
    b = page.text[page.text.index('id="node-cpu-b"') :]
    assert 'data-state="lost"' in a and '<span class="state state-lost">lost</span>' in a
    assert 'data-state="ready"' in b and "Silent for 5 s, as the scheduler counts it." in b
    views["cpu-a"].last_seen += 30  # silent 15 s: suspect
    page = await browser.page("/console/fleet")
    assert page.text.count('data-state="suspect"') == 1
    assert '<span class="state state-suspect">suspect</span>' in page.text


async def test_the_fleet_in_turkish(stack):
    await _register(stack)
    browser = await stack.signed_in()
    await browser.get("/console/lang?to=tr&next=/console/fleet")
    page = await browser.page("/console/fleet")
    assert "Bellek okuma hızı, tek çekirdek" in page.text and "40,0 GB/sn" in page.text and "hazır" in page.text


async def test_the_replicas_placed_on_a_node_are_listed_under_it(stack):
    await _register(stack)
    await call(stack.nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="tester"))
    browser = await stack.signed_in()
    for _ in range(100):  # the scheduler places it; no agent answers there, so it is placed, failed, placed again
        replicas = (await call(stack.nc, scheduler.REPLICA_LIST, Empty())).replicas
        page = await browser.page("/console/fleet")
        shown = [r for r in replicas if f"<code>{r.id}</code>" in page.text]
        if shown:
            break
        await asyncio.sleep(0.1)
    replica = shown[0]
    node = page.text[page.text.index(f'id="node-{replica.node}"') :]
    node = node[: node.index("</article>")]
    assert f"<code>{replica.id}</code>" in node and '<a href="/console/models/tiny">tiny</a>' in node
    assert re.search(r'<span class="state state-(pending|fetching|starting|failed|stopped|draining)">', node)
    assert "No replica runs here." in page.text  # the other node


async def test_a_nodes_release_and_its_upgrade_under_way_or_paused_are_said(stack):
    from llmgw.proto.release import RELEASE_LIST, Release

    await _register(stack)
    said = {
        "cpu-a": Release(node="cpu-a", version="0.2.0", previous="installed", state="done", steps=["agent"], done=1),
        "cpu-b": Release(
            node="cpu-b", version="0.2.0", state="running", steps=["router", "agent"], done=1, waiting_for="<agent>"
        ),
    }

    async def answer(msg):  # each node's agent answers for its own release
        for release in said.values():
            await stack.nc.publish(msg.reply, msgspec.json.encode(release))

    sub = await stack.nc.subscribe(RELEASE_LIST.subject(), cb=answer)
    try:
        browser = await stack.signed_in()
        page = (await browser.page("/console/fleet")).text
        a = page[page.index('id="node-cpu-a"') : page.index('id="node-cpu-b"')]
        b = page[page.index('id="node-cpu-b"') :]
        assert '<dd class="release"><code>0.2.0</code> (before it: installed)</dd>' in a
        assert "upgrading: step 2 of 2, waiting for &lt;agent&gt;" in b
        said["cpu-b"] = msgspec.structs.replace(said["cpu-b"], state="failed", error="the agent on 0.2.0 exited")
        page = (await browser.page("/console/fleet")).text
        assert "upgrade paused: the agent on 0.2.0 exited" in page[page.index('id="node-cpu-b"') :]
    finally:
        await sub.unsubscribe()
