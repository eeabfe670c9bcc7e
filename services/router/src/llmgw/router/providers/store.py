"""The outside providers: kept in the `providers` bucket (every router watches it, and keeps its
own pool of each provider's keys), the endpoints that change and list them (an admin's: `llmgw
ctl provider`, the admin API), and which provider answers a model. Keys are sealed where they are
kept and never shown back; nothing here logs one."""

from __future__ import annotations

import time
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from llmgw.bus import BadRequest, Context, KvTable, NotFound, record_change
from llmgw.proto import BUCKETS, Empty, Model
from llmgw.proto import providers as providers_api
from llmgw.proto.people import AuditEntry
from llmgw.proto.providers import Provider, ProviderList, ProviderRef
from llmgw.router.providers.pool import Pool

__all__ = ["HIDDEN", "Outside", "Providers", "Seals"]

HIDDEN = "(hidden)"
"""What a key reads as when listed (sent back as it is: the key is kept)."""


class Seals(Protocol):
    """Seals secrets where they are kept and opens them (`accounts.sealed.Sealer`)."""

    def seal(self, secret: str) -> str: ...  # noqa: D102
    def open(self, sealed: str) -> str: ...  # noqa: D102
    def is_sealed(self, value: str) -> bool: ...  # noqa: D102


class Outside(NamedTuple):
    """Where a model's requests may go outside: the provider, its pool, the name there."""

    provider: Provider
    pool: Pool
    remote: str
    secrets: dict[str, str]
    """Key name -> the key itself."""


class Providers:
    """The providers, their pools, and which answers a model."""

    def __init__(self, table: KvTable[Provider], nc: Client, sealer: Seals) -> None:
        self.table, self.nc, self.sealer = table, nc, sealer
        self._pools: dict[str, tuple[bytes, Outside]] = {}
        self._pools_at = -1
        """The bucket's version the pools were last let go at."""

    @classmethod
    async def open(cls, js: JetStreamContext, nc: Client, sealer: Seals) -> Providers:
        """Watch the providers bucket; keys sealed and opened with `sealer`."""
        return cls(await KvTable.open(js, BUCKETS["providers"], Provider), nc, sealer)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.provider.*`."""
        await ctx.serve(providers_api.PROVIDER_PUT, self.put)
        await ctx.serve(providers_api.PROVIDER_LIST, self.list_providers)
        await ctx.serve(providers_api.PROVIDER_REMOVE, self.remove)

    def stop(self) -> None:
        """Stop watching."""
        self.table.stop()

    def route(self, model: str) -> Outside | None:
        """The provider that answers `model` (the first by name where several do), with its pool
        (made again where the provider changed, its counts kept per key name)."""
        if self._pools and self._pools_at != self.table.version:  # the bucket changed: pools of providers gone go
            self._let_go()
        for name, provider in sorted(self.table.items.items()):
            if model in provider.models:
                return self._outside(name, provider, model)
        return None

    def _let_go(self) -> None:
        """The pools of providers no longer kept (removed here, or by another router) let go."""
        for name in [n for n in self._pools if n not in self.table.items]:
            del self._pools[name]
        self._pools_at = self.table.version

    def _outside(self, name: str, provider: Provider, model: str) -> Outside:
        encoded = msgspec.json.encode(provider)
        kept = self._pools.get(name)
        if kept is None or kept[0] != encoded:
            pool = Pool(provider.keys)
            if kept is not None:  # what each key spent and its cooling carry over a change, the key kept
                same = {
                    k.name for k in provider.keys if (was := kept[1].pool.slots.get(k.name)) and was.limits.key == k.key
                }
                pool.slots |= {k: s for k, s in kept[1].pool.slots.items() if k in same}
                for key in provider.keys:
                    pool.slots[key.name].limits = key
            secrets = {k.name: self.sealer.open(k.key) for k in provider.keys}
            kept = (encoded, Outside(provider, pool, "", secrets))
            self._pools[name] = kept
        return kept[1]._replace(remote=provider.models[model])

    def models(self) -> dict[str, Model]:
        """The models providers answer, as the router routes one the catalog does not have: named
        as the provider names it here, of its context (worked out once a change of the bucket)."""
        return self.table.derived(_models)

    async def put(self, provider: Provider) -> Provider:
        """Keep a provider: its URL checked, its keys sealed (one sent back hidden kept as it was)."""
        if urlsplit(provider.base_url).scheme not in ("http", "https") or not urlsplit(provider.base_url).hostname:
            raise BadRequest(f"provider {provider.name}: base_url is its http:// or https:// API URL")
        names = [k.name for k in provider.keys]
        if len(set(names)) != len(names):
            raise BadRequest(f"provider {provider.name}: two keys are called the same; name each once")
        was = self.table.items.get(provider.name)
        # a key sent back hidden is kept for the URL it was given for: never sent to another
        before = {k.name: k.key for k in was.keys} if was and was.base_url == provider.base_url else {}
        keys = []
        for key in provider.keys:
            if self.sealer.is_sealed(key.key):
                raise BadRequest(f"provider {provider.name}: key '{key.name}' is a sealed value: give the key itself")
            secret = before.get(key.name, "") if key.key == HIDDEN else self.sealer.seal(key.key)
            if not secret:
                raise BadRequest(
                    f"provider {provider.name}: key '{key.name}' is new, or base_url is: give the key itself"
                )
            keys.append(msgspec.structs.replace(key, key=secret))
        kept = msgspec.structs.replace(provider, keys=keys, created=was.created if was else time.time())
        await self.table.kv.put(provider.name, msgspec.json.encode(kept))
        self.table.items[provider.name] = kept
        await self._audit(provider.by, "put", provider.name, was, kept)
        return _shown(kept)

    async def list_providers(self, _: Empty) -> ProviderList:
        """Every provider (keys hidden) and each key's state on this router."""
        now = time.time()
        self._let_go()
        states = {
            f"{name}.{key}": state
            for name, (_, outside) in self._pools.items()
            for key, state in outside.pool.states(now).items()
        }
        return ProviderList(providers=[_shown(p) for _, p in sorted(self.table.items.items())], keys=states)

    async def remove(self, ref: ProviderRef) -> ProviderList:
        """Remove a provider: its models are answered by their own replicas only (or by none)."""
        provider = self.table.items.get(ref.name)
        if provider is None:
            raise NotFound(f"no provider '{ref.name}': `llmgw ctl provider list`")
        await self.table.kv.delete(ref.name)
        self.table.items.pop(ref.name, None)
        self._pools.pop(ref.name, None)
        await self._audit(ref.by, "remove", ref.name, provider, None)
        return ProviderList(providers=[_shown(provider)])

    async def _audit(self, by: str, action: str, subject: str, was: object, now: object) -> None:
        hidden = [_shown(p) if isinstance(p, Provider) else p for p in (was, now)]
        change = AuditEntry(time=0, who=by, area="providers", action=action, subject=subject)
        await record_change(self.nc, change, *hidden)


def _models(providers: dict[str, Provider]) -> dict[str, Model]:
    out: dict[str, Model] = {}
    for name, provider in sorted(providers.items()):
        for ours in provider.models:
            source = f"providers/{name}/{ours}"
            out.setdefault(ours, Model(name=ours, source=source, context=provider.context, owner=name))
    return out


def _shown(provider: Provider) -> Provider:
    """A provider as it is shown: its keys hidden."""
    return msgspec.structs.replace(provider, keys=[msgspec.structs.replace(k, key=HIDDEN) for k in provider.keys])
