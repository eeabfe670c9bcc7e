"""`llmgw console`: the fleet, the models, the Hub and the keys from a keyboard (Textual).

Every change is one of the operators' operations, asked over NATS as `llmgw ctl` asks it (the
same endpoints, messages and refusals: the service decides, the console shows its words). The
tables are asked again every few seconds; a disruptive change is asked about first, saying what
will happen. Keys: 1-4 (or f, m, h, k) the tabs, enter a row's menu or form, r refresh, l the
other language, ? every key, q quit. NO_COLOR is honoured (Textual's own).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Input, Sparkline, Static, TabbedContent, TabPane

from llmgw.bus import BusError, call
from llmgw.ctl.changes import BY
from llmgw.ctl.tui.adapters import adapters_menu
from llmgw.ctl.tui.dialogs import Confirm, Field, Form, Menu
from llmgw.ctl.tui.forms import FORMS, change_of, fields_of
from llmgw.ctl.tui.rows import HubRow, hub_rows, key_rows, model_table, node_rows, repo_rows, usage_series
from llmgw.ctl.tui.serving import serve_chosen
from llmgw.ctl.tui.words import LANGUAGES, SAID, TYPED, Words
from llmgw.modelplan import speed_note
from llmgw.proto import Empty, ModelEntry, ModelPurge, ModelRef, Page, RepoAdd, catalog, mirror, router, scheduler
from llmgw.proto.catalog import (
    RestartModel,
    ServePlanAsk,
    SetClass,
    StartModel,
    StopModel,
)
from llmgw.proto.hub import HubSearch, fetch_glob
from llmgw.proto.router import UsageQuery

__all__ = ["REFRESH_S", "ConsoleApp"]

REFRESH_S = 3.0
"""How often the tab shown is asked again."""
_HOUR, _DAY = 3600, 24

_TABS = ("fleet", "models", "hub", "keys")
_TABLES = {"fleet": "nodes", "models": "models", "hub": "files", "keys": "keys"}
_COLUMNS = {
    "nodes": ("node", "state", "cpus", "memory", "read", "replicas", "calibrated", "cards"),
    "models": ("model", "ready", "state", "profiles", "memory_mib", "speed", "why"),
    "files": ("repo", "file", "size", "best"),
    "repos": ("repo", "commit", "fetch"),
    "keys": ("key", "name", "limits", "used"),
}


class ConsoleApp(App):
    """The console over one NATS connection `nc` (the operator's credentials, as ctl has them)."""

    TITLE = "llmgw console"
    CSS_PATH = "console.tcss"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "keys", "keys"),
        Binding("r", "refresh", "refresh"),
        Binding("l", "language", "language"),
        Binding("1,f", "tab('fleet')", "fleet tab", show=False),
        Binding("2,m", "tab('models')", "models tab", show=False),
        Binding("3,h", "tab('hub')", "hub tab", show=False),
        Binding("4,k", "tab('keys')", "keys tab", show=False),
        Binding("slash", "search", "search", show=False),
        Binding("g", "fetch", "fetch", show=False),
    ]

    def __init__(self, nc: Client, words: Words | None = None) -> None:
        super().__init__()
        self.nc, self.w = nc, words or Words()
        self.models: dict[str, ModelEntry] = {}
        self.files: dict[str, HubRow] = {}
        self.key_series: dict[str, list[float]] = {}
        """Key id -> its tokens in each hour of the last day (the chart's points)."""
        self.key_names: dict[str, str] = {}

    # -- drawing --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        """The tabs, each a table (the Hub's with its search, the keys' with a chart), the line
        saying what happened, and the keys."""
        yield Header()
        with TabbedContent(id="tabs"):
            for tab in _TABS:
                with TabPane(self.w.t(f"tab.{tab}"), id=f"tab-{tab}"):
                    if tab == "hub":
                        yield Input(placeholder=self.w.t("hub.placeholder"), id="search")
                        yield Static("", id="hubsaid")
                    yield DataTable(id=_TABLES[tab], cursor_type="row", zebra_stripes=True)
                    if tab == "hub":  # what the mirror holds and fetches, below what the Hub has
                        yield DataTable(id="repos", cursor_type="row", zebra_stripes=True)
                    if tab == "keys":
                        yield Static("", id="chartsaid")
                        yield Sparkline([], id="chart")
        yield Static(self.w.t("loading"), id="said")
        yield Footer()

    def on_mount(self) -> None:
        """Columns named, the first tab asked for, and asked again every `REFRESH_S`."""
        self.title = self.w.t("title")
        for table, columns in _COLUMNS.items():
            self.query_one(f"#{table}", DataTable).add_columns(*(self.w.t(f"col.{c}") for c in columns))
        self.action_refresh()
        self.set_interval(REFRESH_S, self.action_refresh)

    def say(self, text: str, refused: bool = False) -> None:
        """One line at the bottom: what was done, or why it was refused (in the warning colour)."""
        said = self.query_one("#said", Static)
        said.update(text)
        said.set_class(refused, "refused")

    @staticmethod
    def _fill(table: DataTable, rows: list[tuple[str, ...]], keys: list[str]) -> None:
        """The table's rows replaced, the cursor kept on the row it was on."""
        at = table.cursor_row
        table.clear()
        for key, row in zip(keys, rows, strict=True):
            table.add_row(*row, key=key)
        if rows:
            table.move_cursor(row=min(at, len(rows) - 1))

    async def ask(self, endpoint, message: msgspec.Struct) -> Any:
        """What `endpoint` answers; None where it refused or failed (said at the bottom)."""
        try:
            return await call(self.nc, endpoint, message)
        except BusError as exc:
            self.say(exc.message, refused=True)
        except NatsError as exc:  # the connection is closed: said; the console stays up
            self.say(f"NATS: {exc}", refused=True)
        return None

    # -- keys -----------------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        """Show `tab` with its table in focus (enter opens a row's menu or form), asked again now."""
        self.query_one("#tabs", TabbedContent).active = f"tab-{tab}"
        self.query_one(f"#{_TABLES[tab]}", DataTable).focus()
        self.action_refresh()

    def action_keys(self) -> None:
        """Every key and what it does (?)."""
        lines = [f"{TYPED.get(b.key, b.key):>8}  {self.w.t(SAID[b.description])}" for b in self.BINDINGS]
        lines += [f"{'enter':>8}  {self.w.t('key.menu')}", f"{'esc':>8}  {self.w.t('form.cancel')}"]
        self.push_screen(Menu(self.w.t("help.title"), [(str(i), line) for i, line in enumerate(lines)]))

    def action_language(self) -> None:
        """The other language (l)."""
        self.w = Words(LANGUAGES[(LANGUAGES.index(self.w.lang) + 1) % len(LANGUAGES)])
        self.title = self.w.t("title")
        for table, columns in _COLUMNS.items():
            view = self.query_one(f"#{table}", DataTable)
            for column, name in zip(view.columns.values(), columns, strict=True):
                column.label = self.w.t(f"col.{name}")
            view.refresh()
        for tab in _TABS:
            self.query_one("#tabs", TabbedContent).get_tab(f"tab-{tab}").label = self.w.t(f"tab.{tab}")

    def action_search(self) -> None:
        """To the Hub's search box (/)."""
        self.action_tab("hub")
        self.query_one("#search", Input).focus()

    @work(exclusive=True, group="refresh")
    async def action_refresh(self) -> None:
        """Ask the fleet again for the tab shown (r, and every few seconds)."""
        tab = self.query_one("#tabs", TabbedContent).active.removeprefix("tab-")
        if tab == "fleet":
            await self._fleet()
        elif tab == "models":
            await self._models()
        elif tab == "keys":
            await self._keys()
        elif tab == "hub":
            await self._mirror()

    async def _mirror(self) -> None:
        listed = await self.ask(mirror.REPO_LIST, Page())
        if listed is not None:
            keys = [f"{r.repo}@{r.commit}" for r in listed.repos]
            self._fill(self.query_one("#repos", DataTable), repo_rows(listed, self.w), keys)

    async def _fleet(self) -> None:
        nodes = await self.ask(scheduler.NODE_LIST, Empty())
        replicas = await self.ask(scheduler.REPLICA_LIST, Empty())
        if nodes is not None and replicas is not None:
            self._fill(
                self.query_one("#nodes", DataTable), node_rows(nodes, replicas, self.w), [n.node for n in nodes.nodes]
            )

    async def _models(self) -> None:
        listed = await self.ask(catalog.MODEL_LIST, Empty())
        replicas = await self.ask(scheduler.REPLICA_LIST, Empty())
        statuses = await self.ask(scheduler.MODEL_STATUS, Empty())
        if listed is None or replicas is None:
            return
        self.models = {e.model.name: e for e in listed.models}
        self._fill(self.query_one("#models", DataTable), model_table(listed, replicas, statuses), list(self.models))

    async def _keys(self) -> None:
        """Each key with its limits and 24 h tokens; the chart: the key under the cursor's tokens
        an hour (`_chart`)."""
        keys = await self.ask(router.KEY_LIST, Empty())
        start = (time.time() // _HOUR - _DAY) * _HOUR
        hourly = await self.ask(router.USAGE_SUM, UsageQuery(since=start, group_by="key", bucket_s=_HOUR))
        if keys is None:
            return
        self.key_series = usage_series(hourly, start, _DAY + 1, _HOUR) if hourly else {}
        used = {k: int(sum(points)) for k, points in self.key_series.items()}
        self.key_names = {kid: k.name for kid, k in keys.keys.items()}
        self._fill(self.query_one("#keys", DataTable), key_rows(keys, used), list(keys.keys))
        self._chart(self._chosen("keys"))

    @on(DataTable.RowHighlighted, "#keys")
    def key_chosen(self, event: DataTable.RowHighlighted) -> None:
        """The chart follows the cursor: that key's tokens an hour."""
        self._chart(event.row_key.value)

    def _chart(self, key: str | None) -> None:
        points = self.key_series.get(key or "", [])
        self.query_one("#chart", Sparkline).data = points
        name = self.key_names.get(key or "", "")
        said = self.w.t("usage.key", name=name) if any(points) else self.w.t("usage.none_key", name=name)
        self.query_one("#chartsaid", Static).update(said)

    # -- the Hub ----------------------------------------------------------------------------------
    @on(Input.Submitted, "#search")
    def search(self, event: Input.Submitted) -> None:
        """The Hub searched for what was typed (in a worker: the keys still answer meanwhile)."""
        if event.value.strip():
            self.run_worker(self._search(event.value.strip()[:200]), exclusive=True, group="search")

    async def _search(self, text: str) -> None:
        """Each GGUF file found, with the best way it runs here."""
        self.query_one("#hubsaid", Static).update(self.w.t("loading"))
        ways = await self.ask(catalog.HUB_SEARCH, HubSearch(text=text))
        if ways is None:
            self.query_one("#hubsaid", Static).update("")
            return
        rows = hub_rows(ways)
        self.files = {r.source: r for r in rows}
        table = self.query_one("#files", DataTable)
        table.clear()
        for r in rows:
            best = f"[b $warning]{r.best}[/]" if r.slow else r.best
            table.add_row(r.repo, r.path, r.size, best, key=r.source)
        read = ways.found.headers_read
        self.query_one("#hubsaid", Static).update(self.w.t("hub.read", n=read, kb=ways.found.bytes_read // 1000))
        table.focus()

    def _chosen(self, table: str) -> str | None:
        view = self.query_one(f"#{table}", DataTable)
        if not view.row_count:
            return None
        return view.coordinate_to_cell_key(view.cursor_coordinate).row_key.value

    async def action_fetch(self) -> None:
        """Fetch the Hub file under the cursor onto the mirror (its repo at the file's commit)."""
        source = self._chosen("files")
        if source is None:
            return
        repo, _, rest = source.partition("@")
        commit, _, path = rest.partition("/")
        queued = await self.ask(mirror.REPO_ADD, RepoAdd(repo=repo, revision=commit, include=[fetch_glob(path)], by=BY))
        if queued is not None:
            self.say(self.w.t("hub.fetching", repo=repo, glob=fetch_glob(path)))

    # -- rows chosen ------------------------------------------------------------------------------
    @on(DataTable.RowSelected, "#models")
    def model_menu(self, event: DataTable.RowSelected) -> None:
        """A model's menu: every change its web card has."""
        name = event.row_key.value
        entry = self.models.get(name)
        if entry is None:
            return
        stopped, cards = entry.model.stopped is not None, any(p.gpus for p in entry.model.profiles)
        items = ["replicas", "resources", "context", "start" if stopped else "stop", "restart", "scaling"]
        items += [*(["gpus"] if cards else []), "class", "owner", "adapters", "remove", "purge"]
        menu = Menu(self.w.t("menu.title", model=name), [(i, self.w.t(f"menu.{i}")) for i in items])
        self.push_screen(menu, lambda chosen: self.run_worker(self._model_action(entry, chosen)))

    async def _model_action(self, entry: ModelEntry, chosen: str | None) -> None:
        m = entry.model
        spec = {"name": m.name, "by": BY, "revision": entry.revision}
        if chosen in ("stop", "restart", "remove", "purge"):
            n = (m.stopped or m.scaling).max
            if not await self.push_screen_wait(Confirm(self.w.t(f"confirm.{chosen}", model=m.name, n=n), self.w)):
                return
        if chosen == "stop":
            await self.change(StopModel(**spec))
        elif chosen == "start":
            await self.change(StartModel(**spec))
        elif chosen == "restart":
            await self.change(RestartModel(**spec))
        elif chosen == "remove":
            await self._done(catalog.MODEL_REMOVE, ModelRef(**spec), m.name)
        elif chosen == "purge":
            await self._done(catalog.MODEL_PURGE, ModelPurge(**spec), m.name)
        elif chosen == "class":
            classes = [(c, self.w.t(f"class.{c}")) for c in ("critical", "standard", "batch")]
            if picked := await self.push_screen_wait(Menu(self.w.t("menu.class"), classes)):
                await self.change(SetClass(**spec, capacity_class=picked))
        elif chosen == "adapters":
            await adapters_menu(self, entry, spec)
        elif chosen in FORMS:
            await self._form(chosen, entry)

    async def _cpu_speed(self, entry: ModelEntry) -> str:
        """What one reply of the model gets on the CPU here, as the serve plan reckons it now."""
        cpu = next((p for p in entry.model.profiles if not p.gpus), None)
        if cpu is None:
            return ""
        ask = ServePlanAsk(source=entry.model.source, context=entry.model.context, cores=cpu.cpu_cores or 0)
        plan = await self.ask(catalog.SERVE_PLAN, ask)
        way = next((w for w in plan.ways if w.kind == "cpu"), None) if plan is not None else None
        return speed_note(way.tokens_per_s) if way is not None else ""

    async def change(self, change: msgspec.Struct) -> None:
        """Ask the catalog for a change of a model; what became of it said at the bottom."""
        await self._done(catalog.MODEL_CHANGE, change, change.name)

    async def _done(self, endpoint, message: msgspec.Struct, name: str) -> bool:
        if await self.ask(endpoint, message) is None:
            return False
        self.say(self.w.t("done.change", model=name))
        self.action_refresh()
        return True

    async def _form(self, kind: str, entry: ModelEntry) -> None:
        """A model's form: asked again until saved with numbers that hold (said in the form), or
        left; the catalog's refusal is said at the bottom."""
        m, w = entry.model, self.w
        spec = {"name": m.name, "by": BY, "revision": entry.revision}
        fields = fields_of(kind, entry, w, await self._cpu_speed(entry) if kind == "replicas" else "")
        while True:
            values = await self.push_screen_wait(Form(w.t(f"menu.{kind}"), fields, w))
            if values is None:
                return
            try:
                change = change_of(kind, values, entry, spec, w)
            except ValueError as exc:
                self.say(str(exc), refused=True)
                fields = [Field(f.id, f.label, values.get(f.id, f.value), f.check) for f in fields]
                continue
            if change is not None:
                await self.change(change)
            return

    @on(DataTable.RowSelected, "#files")
    def serve_form(self, event: DataTable.RowSelected) -> None:
        """A Hub file's serve form."""
        self.run_worker(serve_chosen(self, event.row_key.value))
