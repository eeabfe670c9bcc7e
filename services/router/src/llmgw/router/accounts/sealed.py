"""Secrets the router keeps in its buckets (a directory's bind password, a provider's client
secret, a webhook's signing secret): sealed with AES-GCM under a key worked out from the fleet's
engine secret, so every router opens them and nothing else reads them."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from llmgw.bus import BadRequest

__all__ = ["SEALED", "Sealer"]

SEALED = "sealed.v1."
"""What a sealed value starts with."""


class Sealer:
    """Seals and opens secrets under one key (none: this router has no engine secret)."""

    def __init__(self, key: bytes, purpose: str) -> None:
        self._aead = AESGCM(key[:32]) if key else None
        self._purpose = purpose.encode()

    def seal(self, secret: str) -> str:
        """`secret` sealed (one sealed already, or "", as it is); BadRequest where there is no key."""
        if not secret or secret.startswith(SEALED):
            return secret
        if self._aead is None:
            raise BadRequest(
                "this router has no engine_secret to seal a secret with: give it one (`llmgw up` does), "
                "or name a file holding the secret in the router's config"
            )
        nonce = os.urandom(12)
        return (
            SEALED
            + base64.urlsafe_b64encode(nonce + self._aead.encrypt(nonce, secret.encode(), self._purpose)).decode()
        )

    @staticmethod
    def is_sealed(value: str) -> bool:
        """Whether `value` reads as a sealed one (a secret sent so is refused: it would not open)."""
        return value.startswith(SEALED)

    def open(self, sealed: str) -> str:
        """What a sealed value holds (a value not sealed, as it is; "": sealed under another key,
        or not a value this sealed at all)."""
        if not sealed.startswith(SEALED):
            return sealed
        try:
            raw = base64.urlsafe_b64decode(sealed.removeprefix(SEALED))
            return self._aead.decrypt(raw[:12], raw[12:], self._purpose).decode() if self._aead else ""
        except InvalidTag:  # sealed under another fleet's secret
            return ""
        except ValueError:  # cut short, or not base64: written by hand, not sealed here
            return ""
