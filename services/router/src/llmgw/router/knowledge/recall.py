"""Answers to similar questions, without I/O: which requests may be answered from the answer
cache (and kept in it), the text their conversation is compared by, what an answer keeps of
itself, and a kept answer given again in the shape asked for: the same events where it was
streamed and is streamed again, else a chat completion (or a stream) made of its text."""

from __future__ import annotations

import uuid

import msgspec

from llmgw.proto.knowledge import AnswerCache, CachedAnswer
from llmgw.router.errors import InvalidBody

__all__ = [
    "CACHE_HEADER",
    "SAVED_HEADER",
    "cache_mode",
    "completion_of",
    "conversation_text",
    "eligible",
    "events_of",
    "streamed_content",
]

CACHE_HEADER = "llmgw-cache"
"""The response header that says an answer came from the answer cache (`hit; score=0.97`), or was
kept in it (`miss`)."""
SAVED_HEADER = "llmgw-tokens-saved"
"""The tokens a cached answer saved (its original's prompt and completion)."""
_MODES = ("bypass", "force")


def cache_mode(value: object) -> str:
    """A request's `cache` field: "" (as the tenant's cache says), "bypass" (neither answered
    from nor kept) or "force" (even hot or with tools); InvalidBody else."""
    if value is None:
        return ""
    if value not in _MODES:
        raise InvalidBody('\'cache\' is "bypass" (not answered from the answer cache) or "force".', "cache")
    return str(value)


def eligible(policy: AnswerCache, body: dict, mode: str) -> bool:
    """Whether a chat completion is answered from (and kept in) the answer cache: never bypassed,
    and (unless forced) without tools, one answer (`n` 1) sampled no hotter than the policy says."""
    if mode == "bypass":
        return False
    if mode == "force":
        return True
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or temperature > policy.max_temperature:
        return False
    return not body.get("tools") and not body.get("functions") and body.get("n", 1) == 1


def conversation_text(body: dict, base: str = "") -> str:
    """What a conversation is compared by: each message's role and text, one a line (and the
    knowledge base it is answered from)."""
    lines = [f"knowledge: {base}"] if base else []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if isinstance(content, str):
            lines.append(f"{message.get('role', '')}: {content}")
    return "\n".join(lines)


def streamed_content(events: bytes) -> tuple[str, str] | None:
    """A streamed answer's text and finish reason, from its SSE events; None where it did not end
    well (an error event, no `[DONE]`) or had more than one choice."""
    text, finish = [], ""
    done = False
    for event in events.split(b"\n\n"):
        event = event.strip()
        if event == b"data: [DONE]":
            done = True
        elif event.startswith(b"event: error") or event.startswith(b'data: {"error"'):
            return None
        elif event.startswith(b"data: {"):
            try:
                data = msgspec.json.decode(event[6:])
            except msgspec.DecodeError:
                return None
            for choice in data.get("choices") or []:
                if choice.get("index", 0) != 0:
                    return None
                piece = (choice.get("delta") or {}).get("content")
                text.append(piece if isinstance(piece, str) else "")
                finish = choice.get("finish_reason") or finish
    return ("".join(text), finish or "stop") if done else None


def completion_of(kept: CachedAnswer, model: str, created: int) -> bytes:
    """A kept answer as a chat completion made at `created` (no tokens used: none were)."""
    return msgspec.json.encode(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": kept.content},
                    "finish_reason": kept.finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


def events_of(kept: CachedAnswer, model: str, include_usage: bool, created: int) -> bytes:
    """A kept answer as a stream: its own events where it was streamed, else one chunk of its
    text and one of its end (and a usage chunk of no tokens, where asked)."""
    if kept.events:
        return kept.events
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": created}
    head["model"] = model
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": kept.content}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": kept.finish_reason}]},
    ]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
    return b"".join(b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
