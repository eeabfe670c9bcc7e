"""What an engine's note on disk says of it, so that an agent restarted after a hard kill can
adopt the engine as it is (the replica, where it listens, its cards, its command line), and
whether what runs under the noted pid is that engine. Pure: no I/O."""

from __future__ import annotations

import msgspec

from llmgw.agent.core import Launch, redact
from llmgw.proto import ReplicaSpec

__all__ = ["Found", "engine_note", "found", "noted_argv", "why_not"]


class Found(msgspec.Struct, kw_only=True):
    """An engine as its note describes it."""

    spec: ReplicaSpec
    source: str
    """The weights file it runs on."""
    adapters: list[str] = msgspec.field(default_factory=list)
    """The LoRA adapters' files it loaded."""
    url: str
    kv_events: str = ""
    port: int
    cards: list[str] = msgspec.field(default_factory=list)
    argv: list[str]
    """Its command line, secrets hidden."""


def engine_note(found: Found) -> dict[str, object]:
    """What an engine's pid note says of it besides pid and start (the replica and model too,
    for whoever reads the note)."""
    return {"replica": found.spec.id, "model": found.spec.model, "engine": msgspec.to_builtins(found)}


def found(note: dict) -> Found:
    """The engine a note describes; a ValueError says what is wrong with the note."""
    try:
        return msgspec.convert(note["engine"], Found)
    except (KeyError, TypeError, msgspec.ValidationError) as exc:
        raise ValueError(f"its note does not say what it is ({exc})") from None


def noted_argv(how: Launch, secrets: list[str]) -> list[str]:
    """An engine's command line as its note keeps it: secrets hidden."""
    return [redact(c, secrets) for c in how.argv]


def why_not(engine: Found, cmdline: list[str], secrets: list[str]) -> str:
    """Why the process under the noted pid is not the engine noted (its command line, secrets
    hidden, does not end with the noted arguments), or "" when it is. The program may be named
    differently (a script runs under its interpreter), its arguments may not."""
    now = [redact(c, secrets) for c in cmdline]
    args = engine.argv[1:]
    if len(now) < len(args) or now[len(now) - len(args) :] != args:
        return "its command line is not the one noted"
    return ""
