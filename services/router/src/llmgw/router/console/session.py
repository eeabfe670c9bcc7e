"""Console sessions, pure: a signed cookie naming the admin key that signed in and when the
session ends, a CSRF token bound to it, and short signed notes carried across a redirect.

Nothing is stored on the router: a cookie is `v1.<key id>.<expires>.<nonce>.<mac>`, the mac an
HMAC-SHA256 under the console's secret, so every router holding the same secret (derived from the
fleet's engine secret) accepts it. The key id is checked against the keys bucket on every request,
so revoking the key ends its sessions at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

import msgspec

__all__ = ["BadSession", "ExpiredSession", "Session", "Sessions", "same"]


class BadSession(ValueError):
    """A cookie this console did not sign, or one tampered with."""


class ExpiredSession(ValueError):
    """A session past its end."""


class Session(msgspec.Struct, frozen=True):
    """One signed-in admin: the key's id, when the session ends, its CSRF token."""

    key_id: str
    expires: int
    csrf: str


def same(given: str, expected: str) -> bool:
    """Whether a token sent matches the one expected, in constant time; any text (a token with
    characters outside ASCII is simply not the one)."""
    return hmac.compare_digest(given.encode(), expected.encode())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Issues and opens session cookies, CSRF tokens and notes under one secret."""

    def __init__(self, secret: bytes, lifetime_s: int) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.lifetime_s = lifetime_s

    def _mac(self, purpose: str, text: str) -> str:
        return _b64(hmac.new(self._secret, f"{purpose}|{text}".encode(), hashlib.sha256).digest()[:20])

    def issue(self, key_id: str, now: float) -> tuple[str, Session]:
        """A new session for `key_id` from `now`: (its cookie, the session)."""
        body = f"v1.{key_id}.{int(now) + self.lifetime_s}.{secrets.token_hex(8)}"
        cookie = f"{body}.{self._mac('session', body)}"
        return cookie, self.open(cookie, now)

    def open(self, cookie: str, now: float) -> Session:
        """The session a cookie carries; BadSession or ExpiredSession saying why not."""
        body, _, mac = cookie.rpartition(".")
        parts = body.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not same(mac, self._mac("session", body)):
            raise BadSession("the session cookie is not one this console signed")
        _, key_id, expires, _nonce = parts
        if not expires.isdigit():
            raise BadSession("the session cookie is malformed")
        if int(expires) < now:
            raise ExpiredSession(f"the session ended at {int(expires)}")
        return Session(key_id=key_id, expires=int(expires), csrf=self._mac("csrf", body))

    def anonymous_csrf(self, nonce: str) -> str:
        """The token a sign-in form carries, bound to the browser's pre-session cookie `nonce`."""
        return self._mac("signin", nonce)

    def note(self, kind: str, text: str, purpose: str = "note") -> str:
        """A signed note (what an action did, or why it failed) for the page after a redirect;
        `purpose` keeps one kind of cookie from being taken for another."""
        body = _b64(json.dumps([kind, text]).encode())
        return f"{body}.{self._mac(purpose, body)}"

    def read_note(self, cookie: str, purpose: str = "note") -> tuple[str, str] | None:
        """The note a cookie carries, or None if it is not one this console signed for `purpose`."""
        body, _, mac = cookie.partition(".")
        if not body or not same(mac, self._mac(purpose, body)):
            return None
        try:
            kind, text = json.loads(_unb64(body))
        except (ValueError, TypeError):  # binascii.Error is a ValueError
            return None
        return (kind, text) if isinstance(kind, str) and isinstance(text, str) else None
