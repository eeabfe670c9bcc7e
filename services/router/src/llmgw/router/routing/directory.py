"""What the router routes to: the models and their aliases (the catalog bucket) and each model's
ready replicas with their profiles (the replicas bucket), kept in memory by watching both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection

from nats.js import JetStreamContext

from llmgw.bus import EngineKeys, KvTable, any_change
from llmgw.proto import BUCKETS, CatalogRecord, Model, Profile, ReplicaState
from llmgw.router.routing.balance import Candidate

__all__ = ["Directory", "Ready", "engine_headers", "names_of", "ready_by_model"]

Ready = dict[str, tuple[ReplicaState, Profile]]
"""A model's ready replicas by id, each with its profile."""


def names_of(catalog: dict[str, CatalogRecord]) -> dict[str, str]:
    """Every name a client may ask for (models, their adapters as `MODEL:ADAPTER`, then their
    aliases) -> the model."""
    names = {}
    for name, record in catalog.items():
        names[name] = name
        for adapter in record.model.adapters:
            names[f"{name}:{adapter.name}"] = name
        for alias in record.model.aliases:
            names.setdefault(alias, name)
    return names


def ready_by_model(replicas: dict[str, ReplicaState]) -> dict[str, dict[str, ReplicaState]]:
    """Ready replicas by model, then by id."""
    out: dict[str, dict[str, ReplicaState]] = {}
    for r in replicas.values():
        if r.state == "ready":
            out.setdefault(r.model, {})[r.id] = r
    return out


class Directory:
    """Models, aliases and ready replicas, looked up on every request (indexes are worked out
    once per change of their bucket). `on_replicas` hears the ids of every replica in the bucket
    after each change (the balancer forgets the others). `keys` work out each engine's key."""

    def __init__(
        self,
        catalog: KvTable[CatalogRecord],
        replicas: KvTable[ReplicaState],
        on_replicas: Callable[[Collection[str]], None],
        keys: EngineKeys,
    ) -> None:
        self.catalog, self.replicas, self.on_replicas, self.keys = catalog, replicas, on_replicas, keys
        self._headers: dict[tuple[str, str], dict[str, str]] = {}
        self.outside: Callable[[], dict[str, Model]] = dict
        """The models outside providers answer, by name (the catalog's of a name come first)."""
        self._ready: dict[str, tuple[Model, int, tuple[list[Candidate], Ready]]] = {}
        """Model name -> the model, the replicas bucket's version and its ready replicas then."""

    @classmethod
    async def open(
        cls, js: JetStreamContext, on_replicas: Callable[[Collection[str]], None], keys: EngineKeys
    ) -> Directory:
        """Watch the catalog and replicas buckets."""
        catalog = await KvTable.open(js, BUCKETS["catalog"], CatalogRecord, history=5)
        return cls(catalog, await KvTable.open(js, BUCKETS["replicas"], ReplicaState), on_replicas, keys)

    def headers(self, replica: ReplicaState) -> dict[str, str]:
        """The headers of a request to `replica`'s engine: its key (worked out once per replica,
        kept in memory only, never stored or logged)."""
        where = (replica.node, replica.id)
        if (headers := self._headers.get(where)) is None:
            if len(self._headers) > 4096:  # replicas come and go: forget them all now and then
                self._headers.clear()
            headers = self._headers[where] = engine_headers(self.keys.key(*where))
        return headers

    def stop(self) -> None:
        """Stop watching."""
        self.catalog.stop()
        self.replicas.stop()

    def names(self) -> dict[str, str]:
        """Every name a client may ask for -> the model (the catalog's, then outside providers')."""
        named = self.catalog.derived(names_of)
        outside = self.outside()
        return {**{n: n for n in outside}, **named} if outside else named

    def model(self, asked: str) -> Model | None:
        """The model a name or alias is; None: none."""
        name = self.catalog.derived(names_of).get(asked)
        record = self.catalog.items.get(name) if name else None
        return record.model if record else self.outside().get(asked)

    def embedding_version(self, name: str) -> str | None:
        """What vectors of embedding model `name` are known by: its name and its file (another
        file makes other vectors); None where the catalog has no embedding model of that name."""
        model = self.model(name)
        if model is None or model.kind != "embedding":
            return None
        return f"{model.name}@{hashlib.sha256(model.source.encode()).hexdigest()[:12]}"

    def fallbacks(self, model: Model) -> list[Model]:
        """The model's fallbacks that exist, in its order."""
        return [m for m in (self.model(f) for f in model.fallbacks) if m is not None]

    def ready(self, model: Model, adapter: str = "") -> tuple[list[Candidate], Ready]:
        """The model's ready replicas (those that load `adapter`, where one is asked for) as the
        balancer sees them (priority, weight and slots from their profiles), and each one's
        state and profile by id. Worked out again only when the replicas bucket or the model
        changed (read-only: shared by the requests until then)."""
        kept = self._ready.get(where := f"{model.name}:{adapter}" if adapter else model.name)
        if kept is not None and kept[0] is model and kept[1] == self.replicas.version:
            return kept[2]
        version = self.replicas.version
        states = self.replicas.derived(self._ready_by_model).get(model.name, {})
        profiles = {p.name: p for p in model.profiles}
        ready = {
            r.id: (r, p)
            for r in states.values()
            if (p := profiles.get(r.profile)) is not None and (not adapter or adapter in r.adapters)
        }
        candidates = [
            Candidate(id=i, priority=p.priority, weight=p.weight, slots=p.slots) for i, (_, p) in ready.items()
        ]
        self._ready[where] = (model, version, (candidates, ready))
        return candidates, ready

    def _ready_by_model(self, replicas: dict[str, ReplicaState]) -> dict[str, dict[str, ReplicaState]]:
        self.on_replicas(replicas.keys())
        return ready_by_model(replicas)

    def coming(self, model: Model) -> bool:
        """Whether a replica of `model` is on its way: placed, fetching or starting, or failed
        (the scheduler replaces it)."""
        on_the_way = ("pending", "fetching", "starting", "failed")
        return any(r.model == model.name and r.state in on_the_way for r in self.replicas.items.values())

    def kv_publishers(self) -> dict[str, str]:
        """Ready replicas that publish KV events: id -> their ZMQ endpoint."""
        return {r.id: r.kv_events for r in self.replicas.items.values() if r.state == "ready" and r.kv_events}

    async def replica_news(self, most_s: float | None = None, seen: int | None = None) -> None:
        """Until the replicas bucket changes (a replica ready, say) after `seen` (its `version`;
        None: now), `most_s` at most (None: however long); any number wait on it together."""
        replicas = self.replicas
        await any_change([replicas], replicas.version if seen is None else seen, timeout=most_s)


def engine_headers(api_key: str) -> dict[str, str]:
    """The headers of a request to an engine (its key: never logged)."""
    return {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
