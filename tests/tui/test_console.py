"""The terminal console (`llmgw console`) driven by Textual's own Pilot at 80x24, against real
services over a real nats-server (the catalog, scheduler, mirror with the Hub stand-in, router):
each tab, each form's happy path and its refusals as the service words them."""

from __future__ import annotations

import time

import pytest
from textual.widgets import DataTable, Static

from llmgw.bus import call
from llmgw.ctl.tui import ConsoleApp, Words
from llmgw.gguf import TinyLlama, write_random_llama, write_random_lora
from llmgw.proto import KeyCreate, Limits, Model, ModelPut, ModelRef, Profile, catalog, scheduler
from tests.fleets import SOURCE, cpu_node, serve_router

SIZE = (80, 24)
LORA = "demo/chat-lora/chat.gguf"


@pytest.fixture
async def fleet(serve, nc, tmp_path, hub):
    """A node, the tiny model in the catalog (two profiles), a GGUF repo on the Hub, and a key."""
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    chat = write_random_llama(tmp_path / "chat.Q8_0.gguf", TinyLlama(tensor_type="Q8_0"))
    hub.add_repo("acme/tiny-chat-GGUF", {"tiny-chat.Q8_0.gguf": chat})
    lora = write_random_lora(tmp_path / "chat-lora.gguf", tiny)
    served = await serve_router(serve, nc, tmp_path, tiny, hub=hub, scheduler=True, also={LORA: lora})
    await call(nc, scheduler.NODE_REGISTER, cpu_node("node-a", 40.0))
    profiles = [Profile(name="cpu", replicas=1), Profile(name="big", replicas=0, cpu_cores=2)]
    model = Model(name="tiny", source=SOURCE, profiles=profiles)
    await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="tester"))
    await served.router.accounts.create_key(KeyCreate(name="ci-bot", limits=Limits(tokens_per_day=1000)))
    return served


async def until(pilot, check, what: str, within: float = 30.0):
    """`check()`'s value once truthy (the app drawn again meanwhile)."""
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        await pilot.pause(0.2)
    return got


def cells(app: ConsoleApp, table: str) -> list[list[str]]:
    view = app.query_one(f"#{table}", DataTable)
    return [[str(c) for c in view.get_row_at(i)] for i in range(view.row_count)]


def said(app: ConsoleApp) -> str:
    return str(app.query_one("#said", Static).render())


async def model(nc) -> Model:
    return (await call(nc, catalog.MODEL_GET, ModelRef(name="tiny"))).model


async def test_the_fleet_shows_each_node_with_its_memory_read_rate_and_replicas(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        rows = await until(pilot, lambda: cells(pilot.app, "nodes"), "the node listed")
        node, state, cpus, memory, read, replicas, calibrated, cards = rows[0]
        assert (node, state, cpus, read, cards, calibrated) == ("node-a", "ready", "4", "40/40", "-", "no")
        assert memory == "8.0/8.0" and "tiny:" in replicas


async def test_a_models_replicas_are_set_from_its_menu_and_a_bad_number_is_refused(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: cells(pilot.app, "models"), "the model listed")
        pilot.app.query_one("#models", DataTable).focus()
        await pilot.press("enter")  # its menu; the first item: replicas per profile
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the menu")
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen.query("#f-cpu"), "the replicas form")
        await pilot.press("ctrl+a", "ctrl+k", *"x", "enter")  # not a number: said, the form again
        await until(pilot, lambda: "is not a whole number" in said(pilot.app), "the refusal")
        await until(pilot, lambda: pilot.app.screen.query("#f-cpu"), "the form again")
        await pilot.press("ctrl+a", "ctrl+k", *"2", "enter")
        await until(pilot, lambda: "tiny: done" in said(pilot.app), "the change done")
    assert {p.name: p.replicas for p in (await model(nc)).profiles} == {"cpu": 2, "big": 0}


async def test_stopping_asks_first_saying_what_happens_and_the_catalogs_refusal_is_shown(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        await pilot.press("m")
        await until(pilot, lambda: cells(pilot.app, "models"), "the model listed")
        pilot.app.query_one("#models", DataTable).focus()
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the menu")
        await pilot.press("down", "down", "down", "enter")  # replicas, resources, context, stop
        question = await until(pilot, lambda: pilot.app.screen.query("#question"), "the question")
        assert "Stop tiny? Its 1 replicas stop; start brings them back." in str(question.first().render())
        await pilot.press("n")  # no: nothing changes
        await pilot.pause(0.3)
        assert (await model(nc)).stopped is None
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the menu again")
        await pilot.press("down", "down", "down", "enter")
        await until(pilot, lambda: pilot.app.screen.query("#question"), "the question again")
        await pilot.press("y")
        await until(pilot, lambda: "tiny: done" in said(pilot.app), "stopped")
        assert (await model(nc)).stopped is not None
        await pilot.press("enter")  # the context form: a context below the least is the catalog's to refuse
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the menu once more")
        await pilot.press("down", "down", "enter")
        await until(pilot, lambda: pilot.app.screen.query("#f-context"), "the context form")
        await pilot.press("ctrl+a", "ctrl+k", *"100", "enter")
        await until(pilot, lambda: "Expected `int` >= " in said(pilot.app) or "context" in said(pilot.app), "refused")
    assert (await model(nc)).context == 4096


async def test_the_hub_is_searched_each_file_with_its_best_way_here_and_fetched(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        await pilot.press("slash", *"tiny chat", "enter")
        rows = await until(pilot, lambda: cells(pilot.app, "files"), "a file found", within=60)
        repo, path, size, best = rows[0]
        assert (repo, path) == ("acme/tiny-chat-GGUF", "tiny-chat.Q8_0.gguf") and "Q8_0" in size
        assert best.startswith("CPU, ~") and "tok/s; fits now on node-a" in best
        await pilot.press("g")
        await until(pilot, lambda: "fetching acme/tiny-chat-GGUF" in said(pilot.app), "the fetch queued")
        await pilot.press("r")  # the mirror's repos, below: the fetch there, as it goes
        held = await until(
            pilot, lambda: [r for r in cells(pilot.app, "repos") if r[0] == "acme/tiny-chat-GGUF"], "the repo"
        )
        assert held[0][2].split()[0] in ("queued", "fetching", "verifying", "ready"), held

        def ready() -> bool:
            return any(r[0] == "acme/tiny-chat-GGUF" and r[2].startswith("ready") for r in cells(pilot.app, "repos"))

        await until(pilot, ready, "the fetch done", within=60)
        pilot.app.query_one("#files", DataTable).focus()
        await pilot.press("enter")  # every way it runs here, then the serve form of the one chosen
        ways = await until(pilot, lambda: pilot.app.screen.query("#menu"), "the ways")
        assert "on CPUs" in str(ways.first().get_option_at_index(0).prompt)
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen.query("#f-cores"), "the serve form")
        await pilot.press(*"chat", "enter")
        await until(pilot, lambda: "chat is in the catalog" in said(pilot.app), "served", within=60)
    assert (await call(nc, catalog.MODEL_GET, ModelRef(name="chat"))).model.source.startswith("acme/tiny-chat-GGUF@")


async def test_keys_with_their_limits_and_the_console_in_turkish(fleet, nc):
    async with ConsoleApp(nc, Words("tr")).run_test(size=SIZE) as pilot:
        await pilot.press("4")
        rows = await until(pilot, lambda: [r for r in cells(pilot.app, "keys") if r[1] == "ci-bot"], "the key")
        assert rows[0][2] == "tokens_per_day=1000"
        rows = cells(pilot.app, "keys")
        pilot.app.query_one("#keys", DataTable).move_cursor(row=[r[1] for r in rows].index("ci-bot"))
        chart = pilot.app.query_one("#chartsaid", Static)
        await until(pilot, lambda: "ci-bot anahtarı: son 24 saatte token yok" in str(chart.render()), "its chart")
        assert pilot.app.title == "llmgw konsolu"
        await pilot.press("l")  # the other language
        await pilot.pause(0.2)
        assert pilot.app.title == "llmgw console"


async def _menu(pilot, item: int) -> None:
    """The model's menu opened and its `item`th entry chosen."""
    pilot.app.query_one("#models", DataTable).focus()
    await pilot.press("enter")
    await until(pilot, lambda: pilot.app.screen.query("#menu"), "the menu")
    await pilot.press(*["down"] * item, "enter")


async def _done(pilot) -> None:
    await until(pilot, lambda: "tiny: done" in said(pilot.app), "the change done")
    pilot.app.say("")
    await pilot.pause(1.0)  # the models asked again: the next change is at the new revision


async def test_scaling_class_and_owner_from_the_menu_and_the_cpus_speed_beside_its_count(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: cells(pilot.app, "models"), "the model listed")
        await _menu(pilot, 0)  # replicas: a CPU profile's count with its speed here beside it
        labels = await until(pilot, lambda: [str(x.render()) for x in pilot.app.screen.query("Label")], "the form")
        assert any("Replicas of cpu (on CPUs, ~" in text and "tok/s" in text for text in labels), labels
        await pilot.press("escape")
        await _menu(pilot, 5)  # scaling: min, max, idle
        await until(pilot, lambda: pilot.app.screen.query("#f-max"), "the scaling form")
        await pilot.press("tab", "ctrl+a", "ctrl+k", "3", "enter")
        await _done(pilot)
        await _menu(pilot, 6)  # class: a menu of three
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the classes")
        await pilot.press("enter")  # the first: critical
        await _done(pilot)
        await _menu(pilot, 7)  # owner
        await until(pilot, lambda: pilot.app.screen.query("#f-owner"), "the owner form")
        await pilot.press(*"ml-team", "enter")
        await _done(pilot)
    after = await model(nc)
    assert (after.scaling.min, after.scaling.max, after.capacity_class, after.owner) == (1, 3, "critical", "ml-team")


async def test_an_adapter_is_attached_and_detached_from_the_menu(fleet, nc):
    async with ConsoleApp(nc, Words("en")).run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: cells(pilot.app, "models"), "the model listed")
        await _menu(pilot, 8)  # adapters: attach, or detach one
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the adapters' menu")
        await pilot.press("enter")  # attach
        await until(pilot, lambda: pilot.app.screen.query("#f-source"), "the attach form")
        await pilot.press(*LORA, "enter")
        await _done(pilot)
        assert [(a.name, a.source) for a in (await model(nc)).adapters] == [("chat", LORA)]
        await _menu(pilot, 8)
        await until(pilot, lambda: pilot.app.screen.query("#menu"), "the adapters' menu again")
        await pilot.press("down", "enter")  # detach tiny:chat, asked first
        await until(pilot, lambda: pilot.app.screen.query("#question"), "the question")
        await pilot.press("y")
        await _done(pilot)
    assert (await model(nc)).adapters == []
