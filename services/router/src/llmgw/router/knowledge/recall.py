"""Answers to similar questions, without I/O: which requests may be answered from the answer
cache (and kept in it), the text their conversation is compared by and what else of it must be
the same (its variant), what an answer keeps of itself, and a kept answer given again in the
shape asked for: the same events where it was streamed and is streamed again, else a chat
completion (or a stream) made of its text."""

from __future__ import annotations

import hashlib
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
    "text_of",
    "variant_of",
]

CACHE_HEADER = "llmgw-cache"
"""The response header that says an answer came from the answer cache (`hit; score=0.97`), or was
kept in it (`miss`)."""
SAVED_HEADER = "llmgw-tokens-saved"
"""The tokens a cached answer saved (its original's prompt and completion)."""
_MODES = ("bypass", "force")
_NOT_VARIANT = frozenset(
    ("messages", "model", "stream", "stream_options", "cache", "temperature", "n", "user", "metadata", "store")
)
"""What of a request leaves its answer as it is (how it is delivered, who asks, the sampling
temperature the policy bounds): everything else must be the same for a kept answer to be given."""


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


def text_of(content: object) -> str | None:
    """A message's text: its content where that is a string, else its text parts' joined (a part
    whose text is not a string counts as none); None where it has neither."""
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if _is_text(p) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else None


def _is_text(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text"


def conversation_text(body: dict) -> str:
    """What a conversation is compared by: each message's role and text, one a line."""
    lines = []
    for message in body.get("messages") or []:
        if isinstance(message, dict) and (text := text_of(message.get("content"))) is not None:
            lines.append(f"{message.get('role', '')}: {text}")
    return "\n".join(lines)


def variant_of(body: dict, knowledge: str = "") -> str:
    """What must be the same, beside a conversation's text, for a kept answer to answer it (a
    digest): the request's other fields (`max_tokens`, `tools`, `response_format`, `seed`...), its
    messages' parts that are not text (an image) and fields beside role and content, and
    `knowledge`, the base it is answered from as it is now (`Knowledge.edition`)."""
    rest = {k: v for k, v in body.items() if k not in _NOT_VARIANT}
    parts = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            parts.append(message)
            continue
        content = message.get("content")
        others = [p for p in content if not _is_text(p)] if isinstance(content, list) else []
        beside = {k: v for k, v in message.items() if k not in ("role", "content")}
        parts.append([others, beside] if others or beside else 0)
    whole = msgspec.json.encode({"body": rest, "messages": parts, "knowledge": knowledge}, order="sorted")
    return hashlib.sha256(whole).hexdigest()[:32]


def streamed_content(events: bytes) -> tuple[str, str] | None:
    """A streamed answer's text and finish reason, from its SSE events; None where it did not end
    well (an error event, no `[DONE]`), had more than one choice, or called a tool (as an answer
    not streamed that calls one is not kept either)."""
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
                delta = choice.get("delta") or {}
                if delta.get("tool_calls") or delta.get("function_call"):
                    return None
                piece = delta.get("content")
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
