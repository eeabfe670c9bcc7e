"""Signing in with an OpenID Connect provider: the authorization code flow with PKCE (S256), a
state bound to the browser and a nonce bound to the ID token; the ID token's signature checked
against the provider's published keys (joserfc), its issuer, audience, expiry and nonce checked;
its claims mapped to a name and a role per tenant.

`Provider` reads the provider's discovery document and keys (aiohttp); `begin`, `check_id_token`
and `who` are pure.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from typing import Any, NamedTuple
from urllib.parse import urlencode

import aiohttp
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from llmgw.proto.people import OidcSettings, Role
from llmgw.router.accounts.ldap import best_roles

__all__ = ["LEEWAY_S", "Begun", "OidcError", "Provider", "begin", "check_id_token", "who"]

LEEWAY_S = 60
"""How far the provider's clock may be from ours (an ID token's times)."""
_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
"""What an ID token may be signed with (never `none`, never a shared-secret HMAC)."""


class OidcError(Exception):
    """The provider could not be asked, or what it answered does not sign anyone in: said plainly
    (never with a token or a secret in it)."""


class Begun(NamedTuple):
    """A sign-in sent to the provider: where the browser goes, and what it must come back with
    (kept in a signed cookie until it does)."""

    url: str
    state: str
    nonce: str
    verifier: str


class Provider(NamedTuple):
    """A provider's endpoints and signing keys, as its discovery document says."""

    issuer: str
    authorize: str
    token: str
    keys: KeySet

    @classmethod
    async def discover(cls, s: OidcSettings, http: aiohttp.ClientSession) -> Provider:
        """Read `<issuer>/.well-known/openid-configuration` and the keys it names; OidcError
        saying what is wrong (unreachable, another issuer, no keys)."""
        url = f"{s.issuer.rstrip('/')}/.well-known/openid-configuration"
        found = await _json(http, url, s.timeout_s)
        if found.get("issuer", "").rstrip("/") != s.issuer.rstrip("/"):
            raise OidcError(f"{url} names issuer {found.get('issuer')!r}, not {s.issuer!r}: give the issuer it names")
        try:
            keys = KeySet.import_key_set(await _json(http, found["jwks_uri"], s.timeout_s))
            return cls(found["issuer"], found["authorization_endpoint"], found["token_endpoint"], keys)
        except (KeyError, ValueError, JoseError) as exc:
            raise OidcError(f"{url} lacks what sign-in needs ({type(exc).__name__}: {exc})") from None

    async def redeem(self, s: OidcSettings, code: str, begun: Begun, back: str) -> str:
        """Trade the code the browser came back with (and the PKCE verifier) for the ID token, to
        be checked (`check_id_token`); OidcError where the provider refuses it (a code used twice,
        another client's, a verifier not the challenge's)."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": back,
            "code_verifier": begun.verifier,
            "client_id": s.client_id,
        }
        auth = aiohttp.BasicAuth(s.client_id, s.client_secret) if s.client_secret else None
        timeout = aiohttp.ClientTimeout(total=s.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            try:
                async with http.post(self.token, data=form, auth=auth) as answer:
                    body = await answer.json(content_type=None)
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise OidcError(f"the provider's token endpoint did not answer ({type(exc).__name__})") from None
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("id_token"), str):
            said = body.get("error", "") if isinstance(body, dict) else ""
            raise OidcError(f"the provider refused the code ({status} {said})".rstrip())
        return body["id_token"]


async def _json(http: aiohttp.ClientSession, url: str, timeout_s: float) -> dict[str, Any]:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as answer:
            if answer.status != 200:
                raise OidcError(f"{url} answered {answer.status}")
            found = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise OidcError(f"{url} did not answer ({type(exc).__name__}: {exc})") from None
    if not isinstance(found, dict):
        raise OidcError(f"{url} is not a JSON object")
    return found


def _challenge(verifier: str) -> str:
    """PKCE's S256: the verifier's SHA-256, base64url without padding (RFC 7636)."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def begin(s: OidcSettings, provider: Provider, back: str) -> Begun:
    """A new sign-in: the provider's authorization URL with a fresh state, nonce and PKCE
    challenge, the browser to come back to `back`."""
    state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    query = {
        "response_type": "code",
        "client_id": s.client_id,
        "redirect_uri": back,
        "scope": " ".join(dict.fromkeys(["openid", *s.scopes])),
        "state": state,
        "nonce": nonce,
        "code_challenge": _challenge(verifier),
        "code_challenge_method": "S256",
    }
    joiner = "&" if "?" in provider.authorize else "?"
    return Begun(f"{provider.authorize}{joiner}{urlencode(query)}", state, nonce, verifier)


def check_id_token(token: str, provider: Provider, client_id: str, nonce: str, now: int | None = None) -> dict:
    """The claims of an ID token that holds: signed by one of the provider's keys, issued by it,
    for `client_id`, not expired (`LEEWAY_S` either way), carrying `nonce`; OidcError saying
    which does not."""
    try:
        decoded = jwt.decode(token, provider.keys, algorithms=list(_ALGORITHMS))
    except (JoseError, ValueError) as exc:
        raise OidcError(f"the ID token's signature does not hold ({type(exc).__name__})") from None
    claims = decoded.claims
    rules = jwt.JWTClaimsRegistry(
        now=now,
        leeway=LEEWAY_S,
        iss={"essential": True, "value": provider.issuer},
        aud={"essential": True, "value": client_id},
        exp={"essential": True},
        sub={"essential": True},
        nonce={"essential": True, "value": nonce},
    )
    try:
        rules.validate(claims)
    except JoseError as exc:
        raise OidcError(f"the ID token does not hold: {exc.error} ({exc.description or 'claim'})") from None
    audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audience) > 1 and claims.get("azp") != client_id:
        raise OidcError("the ID token names several audiences and was not issued to this client (azp)")
    return claims


def who(s: OidcSettings, claims: dict) -> tuple[str, dict[str, Role]]:
    """The name a provider's user signs in under (`name_claim`, then the e-mail's local part, then
    the subject; what a name may not hold written '-') and the roles its groups claim maps to.
    The user is bound to its issuer and subject: another with the same name is refused."""
    email = claims.get("email")
    local = email.split("@", 1)[0] if isinstance(email, str) else ""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", str(claims.get(s.name_claim) or local or claims["sub"]))
    held = claims.get(s.groups_claim, [])
    groups = (
        [held] if isinstance(held, str) else [g for g in held if isinstance(g, str)] if isinstance(held, list) else []
    )
    return name.lstrip("-_")[:63], best_roles(s.groups, groups)
