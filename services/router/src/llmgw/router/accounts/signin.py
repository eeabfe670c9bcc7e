"""The sign-in settings: a directory (LDAP) and an OpenID Connect provider, from the router's config
file or set by an admin (console, `llmgw ctl signin`, the admin API) and then kept in the settings
bucket, which wins. Settings are tried before they are kept, and refused saying which part failed.

The secrets given with them (the directory's bind password, the provider's client secret) are
sealed with AES-GCM under a key worked out from the fleet's engine secret, so every router can
open them and nothing else reads them; they are never shown back (what is shown says only which
are kept), never logged, and the audit trail writes `***` for them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import msgspec
from nats.js import JetStreamContext

from llmgw.bus import BadRequest, Context, KvTable
from llmgw.proto import BUCKETS, Empty
from llmgw.proto import people as people_api
from llmgw.proto.people import AuditEntry, LdapSettings, OidcSettings, SignInSettings, SignInTried, SignInTry
from llmgw.router.accounts.audit import Audit
from llmgw.router.accounts.ldap import DirectoryError, try_settings
from llmgw.router.accounts.oidc import OidcError, Provider
from llmgw.router.accounts.sealed import Sealer

__all__ = ["SignIn"]

_KEY = "signin"
_PROVIDER_KEPT_S = 600.0
"""How long a provider's discovery document and keys are used before they are read again (and
at once when a token is signed by a key not among them)."""


class SignIn:
    """The sign-in settings in force on this router, and the endpoints that show, try and keep them."""

    def __init__(self, table: KvTable[SignInSettings], seal_key: bytes, config: SignInSettings, audit: Audit) -> None:
        self.table, self.audit = table, audit
        self.sealer = Sealer(seal_key, "signin")
        self._config = config
        self._provider: tuple[bytes, float, Provider] | None = None

    @classmethod
    async def open(cls, js: JetStreamContext, seal_key: bytes, config: SignInSettings, audit: Audit) -> SignIn:
        """Watch the settings bucket; `config`: the router's own (config file), used until an admin keeps others."""
        return cls(await KvTable.open(js, BUCKETS["settings"], SignInSettings), seal_key, config, audit)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.signin.*`."""
        await ctx.serve(people_api.SIGNIN_SHOW, self.show)
        await ctx.serve(people_api.SIGNIN_TRY, self.try_settings)
        await ctx.serve(people_api.SIGNIN_PUT, self.put)

    def stop(self) -> None:
        """Stop watching."""
        self.table.stop()

    # -- in force ----------------------------------------------------------------------------------
    def _kept(self) -> SignInSettings:
        return self.table.items.get(_KEY) or self._config

    @property
    def ldap(self) -> LdapSettings | None:
        """The directory people sign in with, its bind password opened (None: none)."""
        s = self._kept().ldap
        return None if s is None else msgspec.structs.replace(s, bind_password=self.sealer.open(s.bind_password))

    @property
    def oidc(self) -> OidcSettings | None:
        """The provider people sign in with, its client secret opened or read (None: none)."""
        s = self._kept().oidc
        if s is None:
            return None
        secret = self.sealer.open(s.client_secret)
        if not secret and s.client_secret_file:
            secret = Path(s.client_secret_file).read_text().strip()
        return msgspec.structs.replace(s, client_secret=secret)

    async def provider(self, fresh: bool = False) -> Provider:
        """The provider's endpoints and keys (read again past `_PROVIDER_KEPT_S`, or `fresh`)."""
        s = self.oidc
        if s is None:
            raise OidcError("no OpenID Connect provider is set up here")
        tag, now = msgspec.json.encode(s), time.monotonic()
        if fresh or self._provider is None or self._provider[0] != tag or now - self._provider[1] > _PROVIDER_KEPT_S:
            async with aiohttp.ClientSession() as http:
                self._provider = (tag, now, await Provider.discover(s, http))
        return self._provider[2]

    # -- secrets ---------------------------------------------------------------------------------
    def _merged(self, given: SignInSettings) -> SignInSettings:
        """`given` with each secret left empty taken from what is kept (opened). Secrets come in
        themselves, never as files: a file named from afar would have the router read any file
        it may and send it to the directory or provider named with it."""
        if (given.ldap and given.ldap.bind_password_file) or (given.oidc and given.oidc.client_secret_file):
            raise BadRequest(
                "a secret is given here itself (it is sealed), not as a file: files are named in the router's config"
            )
        kept = self._kept()
        ldap, oidc = given.ldap, given.oidc
        if ldap is not None and not ldap.bind_password and kept.ldap is not None:
            ldap = msgspec.structs.replace(ldap, bind_password=self.sealer.open(kept.ldap.bind_password))
        if oidc is not None and not oidc.client_secret and kept.oidc is not None:
            oidc = msgspec.structs.replace(oidc, client_secret=self.sealer.open(kept.oidc.client_secret))
        return msgspec.structs.replace(given, ldap=ldap, oidc=oidc)

    # -- endpoints ---------------------------------------------------------------------------------
    async def show(self, _: Empty | None = None) -> SignInSettings:
        """The settings in force, without their secrets (which are kept is said)."""
        return _shown(self._kept())

    async def try_settings(self, req: SignInTry) -> SignInTried:
        """What each part of `req.settings` does, one sentence each; a part that fails says why."""
        said, _ = await self._try(self._merged(req.settings), req.name)
        return SignInTried(said=said)

    async def _try(self, s: SignInSettings, name: str = "") -> tuple[list[str], bool]:
        said, ok = [], True
        if s.ldap is not None:
            try:
                said.append("directory: " + await asyncio.to_thread(try_settings, s.ldap, name))
            except (DirectoryError, OSError, ValueError) as exc:  # ValueError: a path no file can have
                said.append(f"directory: failed: {exc}")
                ok = False
        if s.oidc is not None:
            try:
                async with aiohttp.ClientSession() as http:
                    found = await Provider.discover(s.oidc, http)
                said.append(
                    f"provider: {found.issuer} answered: sign-in at {found.authorize}, "
                    f"{len(found.keys.keys)} signing keys"
                )
            except OidcError as exc:
                said.append(f"provider: failed: {exc}")
                ok = False
        return said or ["local users only: no directory and no provider"], ok

    async def put(self, given: SignInSettings) -> SignInTried:
        """Keep `given` once each of its parts was tried and worked (BadRequest with what each said
        where one did not); its secrets sealed, and a secret left empty keeping the one kept."""
        merged = self._merged(given)
        said, ok = await self._try(merged)
        if not ok:
            raise BadRequest("not kept: " + "; ".join(said))
        kept = msgspec.structs.replace(
            merged,
            ldap=merged.ldap
            and msgspec.structs.replace(merged.ldap, bind_password=self.sealer.seal(merged.ldap.bind_password)),
            oidc=merged.oidc
            and msgspec.structs.replace(merged.oidc, client_secret=self.sealer.seal(merged.oidc.client_secret)),
            secrets_kept=[],
        )
        before = _shown(self._kept())
        await self.table.kv.put(_KEY, msgspec.json.encode(kept))
        self.table.items[_KEY] = kept
        change = AuditEntry(time=0, who=given.by, area="signin", action="put", subject="signin")
        await self.audit.record(change, before, _shown(kept))
        return SignInTried(said=said)


def _shown(s: SignInSettings) -> SignInSettings:
    """Settings as they are shown: every secret empty, which are kept said."""
    kept = []
    ldap, oidc = s.ldap, s.oidc
    if ldap is not None:
        kept += ["ldap.bind_password"] if ldap.bind_password or ldap.bind_password_file else []
        ldap = msgspec.structs.replace(ldap, bind_password="")
    if oidc is not None:
        kept += ["oidc.client_secret"] if oidc.client_secret or oidc.client_secret_file else []
        oidc = msgspec.structs.replace(oidc, client_secret="")
    return msgspec.structs.replace(s, ldap=ldap, oidc=oidc, secrets_kept=kept)
