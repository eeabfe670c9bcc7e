"""Requests only one role may make, signed with that role's nkey, so that the service asked acts on
them only when that role sent them.

Why: NATS checks who publishes on a subject, not what the server itself delivers there for another
client. A consumer's delivery subject is not checked against its creator's permissions, so a role
that may read a bucket could have the bucket's values delivered on an agent's start or stop
subject. A signature cannot be made that way: only the holder of the seed signs.

A signature covers the subject, the time it was made and the payload's sha256 (headers SIGNED_AT
and SIGNATURE): moved to another subject, changed, older than WINDOW_S, or seen before, it is
refused. The clock is passed in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
from collections.abc import Mapping
from pathlib import Path

import nacl.exceptions
import nacl.signing
import nkeys

from llmgw.bus._access import CredentialsError, read_identity
from llmgw.proto.errors import BadRequest

__all__ = ["SIGNATURE", "SIGNED_AT", "WINDOW_S", "SignatureError", "Signer", "Verifier", "public_key"]

SIGNED_AT = "Llmgw-Signed-At"
"""The header with the Unix time a request was signed at (milliseconds, as text)."""
SIGNATURE = "Llmgw-Signature"
"""The header with the signature (ed25519, base64) of the subject, that time and the payload's sha256."""
WINDOW_S = 120.0
"""How far a signature's time may be from the verifier's clock, either way (clocks kept by NTP)."""

_PUBLIC = re.compile(r"U[A-Z2-7]{55}")


class SignatureError(BadRequest):
    """A request that its service acts on only when signed, not signed rightly (a 400 that says why)."""


def _signed(subject: str, at: str, payload: bytes) -> bytes:
    """What a signature covers: the subject, the time and the payload's sha256."""
    digest = hashlib.sha256(payload).hexdigest()
    return f"llmgw-signed-v1\n{subject}\n{at}\n{digest}".encode()


def public_key(value: str) -> str:
    """A public nkey (`U...`) given as itself or as a file holding it (`llmgw access write` writes
    `creds/scheduler.pub`); a CredentialsError names what is wrong."""
    key = value.strip()
    if not _PUBLIC.fullmatch(key):
        try:
            key = Path(value).read_text().strip()
        except OSError as exc:
            raise CredentialsError(
                f"public key {value!r}: neither a public nkey (U..., 56 characters) nor a file holding one "
                f"({exc.strerror})"
            ) from None
    try:
        _verify_key(key)
    except ValueError as exc:
        raise CredentialsError(f"public key {value!r}: {exc}") from None
    return key


def _verify_key(key: str) -> nacl.signing.VerifyKey:
    """The ed25519 key of a user's public nkey, its prefix and checksum checked."""
    if not _PUBLIC.fullmatch(key):
        raise ValueError("not a user's public nkey (U..., 56 characters)")
    raw = base64.b32decode(key + "=" * (-len(key) % 8))
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if body[0] != nkeys.PREFIX_BYTE_USER or nkeys.crc16(body) != crc:
        raise ValueError("its checksum does not match (damaged or cut short)")
    return nacl.signing.VerifyKey(bytes(body[1:]))


class Signer:
    """Signs the requests one identity sends (the scheduler's to agents)."""

    def __init__(self, seed: str) -> None:
        self._keys = nkeys.from_seed(seed.encode())
        self.public = self._keys.public_key.decode()
        """The public key a verifier is given."""

    @classmethod
    def from_creds(cls, path: Path | str) -> Signer:
        """The signer of the identity in a credentials file (a CredentialsError names the file)."""
        return cls(read_identity(path).seed)

    def headers(self, subject: str, payload: bytes, now: float) -> dict[str, str]:
        """The headers that sign `payload` sent on `subject` at `now` (Unix time)."""
        at = f"{now:.3f}"
        signature = self._keys.sign(_signed(subject, at, payload))
        return {SIGNED_AT: at, SIGNATURE: base64.b64encode(signature).decode()}


class Verifier:
    """Checks that requests were signed by one key (`who`: whose it is, as an error names it), for
    the subject they came on, within `window_s` of now, and not seen before."""

    def __init__(self, public: str, who: str = "the scheduler", window_s: float = WINDOW_S) -> None:
        self._key = _verify_key(public)
        self.public, self.who, self.window_s = public, who, window_s
        self._seen: dict[bytes, float] = {}
        """Signatures accepted, and when each leaves the window (a replay inside it is refused)."""

    def check(self, subject: str, payload: bytes, headers: Mapping[str, str] | None, now: float) -> None:
        """Nothing when the request is signed rightly; else a SignatureError saying why."""
        headers = headers or {}
        at, signature = headers.get(SIGNED_AT, ""), headers.get(SIGNATURE, "")
        if not at or not signature:
            raise SignatureError(f"{subject}: not signed; only {self.who} may ask it, and it signs every request")
        try:
            when = float(at)
            raw = base64.b64decode(signature, validate=True)
        except (ValueError, binascii.Error):
            raise SignatureError(f"{subject}: a signature or time that does not decode") from None
        if not math.isfinite(when) or abs(now - when) > self.window_s:
            off = f"{abs(now - when):.0f} s" if math.isfinite(when) else "a time"
            raise SignatureError(
                f"{subject}: signed {off} away from now, more than {self.window_s:.0f} s: "
                "replayed, or a clock off (keep every machine's clock by NTP)"
            )
        try:
            self._key.verify(_signed(subject, at, payload), raw)
        except (nacl.exceptions.BadSignatureError, ValueError):
            raise SignatureError(
                f"{subject}: not signed by {self.who}'s key for this subject and payload "
                "(another key, another subject, or changed)"
            ) from None
        self._forget(now)
        if raw in self._seen:
            raise SignatureError(f"{subject}: a signed request seen before: replayed")
        self._seen[raw] = when + self.window_s

    def _forget(self, now: float) -> None:
        """Drop the signatures whose time has left the window (a replay of those is too old)."""
        while self._seen:
            first = next(iter(self._seen))
            if self._seen[first] >= now:
                break
            del self._seen[first]
