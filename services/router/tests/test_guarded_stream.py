"""A streamed answer under a policy, event by event (the router's `_StreamGuard`, fed by hand):
a stream cut short mid-placeholder still gives what it held, restored and checked."""

from __future__ import annotations

import json
from types import SimpleNamespace

from llmgw.proto.guard import Check, Policy
from llmgw.router.guard.redact import Redaction
from llmgw.router.request.guarded import _StreamGuard


async def _events(*pieces: bytes):
    for piece in pieces:
        yield piece


def _texts(out: list[bytes]) -> tuple[str, list[dict]]:
    text, errors = "", []
    for event in b"".join(out).split(b"\n\n"):
        if event.startswith(b"data: {"):
            data = json.loads(event[6:])
            errors += [data["error"]] if "error" in data else []
            text += "".join(c["delta"].get("content") or "" for c in data.get("choices", []))
    return text, errors


async def _run(policy: Policy, redaction: Redaction, *pieces: bytes) -> list[bytes]:
    guard = _StreamGuard(policy, redaction, SimpleNamespace(patterns={}), lambda name, seen: None)
    return [piece async for piece in guard.events(_events(*pieces))]


def _delta(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


async def test_a_stream_cut_mid_placeholder_gives_what_it_held_restored():
    redaction = Redaction()
    redaction.placeholder("EMAIL", "ada@example.com")
    out = await _run(Policy(name="p"), redaction, _delta("Hi "), _delta("<EMA"))
    assert _texts(out) == ("Hi <EMA", [])  # a placeholder cut short is given as it stands
    out = await _run(Policy(name="p"), redaction, _delta("Hi "), _delta("<EMAIL_1"), _delta(">"))
    assert _texts(out) == ("Hi ada@example.com", [])


async def test_what_a_cut_stream_held_is_checked_before_it_goes_out():
    blocking = Policy(name="p", output=[Check(kind="pii", action="block", entities=["email"])])
    out = await _run(blocking, Redaction(), _delta("write to "), _delta("ada@example.com"))
    text, errors = _texts(out)
    assert "ada@example.com" not in text and errors and "policy 'p'" in errors[0]["message"]


def _text(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


async def test_a_completions_stream_gets_what_was_held_in_its_own_text_field():
    redaction = Redaction()
    redaction.placeholder("EMAIL", "ada@example.com")
    out = await _run(Policy(name="p"), redaction, _text("Hi "), _text("<EMAIL_1"))
    events = [json.loads(e[6:]) for e in b"".join(out).split(b"\n\n") if e.startswith(b"data: {")]
    assert "".join(c.get("text") or "" for e in events for c in e["choices"]) == "Hi <EMAIL_1"
    assert all("delta" not in c for e in events for c in e["choices"])


async def test_what_was_held_goes_out_before_an_error_event_not_after():
    redaction = Redaction()
    redaction.placeholder("EMAIL", "ada@example.com")
    error = b'data: {"error": {"message": "engine gone"}}\n\n'
    out = b"".join(await _run(Policy(name="p"), redaction, _delta("Hi <EMAIL_1"), error))
    assert out.index(b"<EMAIL_1") < out.index(b"engine gone") and out.count(b"EMAIL_1") == 1
