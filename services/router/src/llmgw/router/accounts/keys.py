"""API keys, without I/O: how a key is stored (its hash) and which key an `Authorization` header
names, or why it names none."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from llmgw.proto import KeyRecord
from llmgw.router.errors import ExpiredKey, InvalidKey, MissingKey, NotAdmin

__all__ = ["authorize", "key_hash"]


def key_hash(key: str) -> str:
    """How an API key is stored: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def authorize(header: str, keys: Mapping[str, KeyRecord], now: float, admin: bool = False) -> tuple[str, KeyRecord]:
    """The key an `Authorization` header names: (its id, its record); 401 or 403 saying why not."""
    if not header.lower().startswith("bearer "):
        raise MissingKey("Missing API key: send 'Authorization: Bearer <key>'.")
    digest = key_hash(header[7:].strip())
    record = keys.get(digest)
    if record is None:
        raise InvalidKey("Incorrect API key provided.")
    if record.expires is not None and record.expires < now:
        raise ExpiredKey(
            f"This API key expired at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(record.expires))}; "
            "ask for a new one."
        )
    if admin and not record.admin:
        raise NotAdmin("This key may not use the admin API; use an admin key.")
    return digest[:16], record
