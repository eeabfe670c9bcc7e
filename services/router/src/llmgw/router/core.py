"""The router's rules, without I/O: errors in OpenAI's shape, picking a replica, rewriting chunks."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from llmgw.proto import ReplicaState

__all__ = ["ApiError", "key_hash", "pick", "rewrite_chunk"]


class ApiError(Exception):
    """An answer in the OpenAI error body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def key_hash(key: str) -> str:
    """How an API key is stored: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def pick(replicas: list[ReplicaState], outstanding: Mapping[str, int], exclude: set[str]) -> ReplicaState | None:
    """The ready replica with the fewest requests in flight (ties: the first by id)."""
    ready = [r for r in replicas if r.state == "ready" and r.id not in exclude]
    return min(ready, key=lambda r: (outstanding.get(r.id, 0), r.id), default=None)


def rewrite_chunk(data: bytes, model: str, include_usage: bool) -> bytes | None:
    """One SSE `data:` payload as the client should see it; None drops it.

    The engine is always asked for usage; a client that did not ask gets none of it.
    """
    chunk = msgspec.json.decode(data)
    if not isinstance(chunk, dict):
        return data
    chunk["model"] = model
    if not include_usage and "usage" in chunk:
        if not chunk.get("choices"):
            return None
        del chunk["usage"]
    chunk.pop("timings", None)
    return msgspec.json.encode(chunk)
