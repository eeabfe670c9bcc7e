"""The router's rules, without I/O: errors in OpenAI's shape, checking a request before any
engine sees it, rewriting chunks. Picking a replica is `balance.py`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from llmgw.proto import Model, Profile, UsageRecord, UsageRow

__all__ = [
    "ApiError",
    "Checked",
    "check_context",
    "check_request",
    "context_of",
    "key_hash",
    "may_exceed",
    "rewrite_chunk",
    "sum_usage",
    "tokenize_request",
    "usage_of",
]


class ApiError(Exception):
    """An answer in the OpenAI error body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def key_hash(key: str) -> str:
    """How an API key is stored: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


class Checked(msgspec.Struct, kw_only=True):
    """A request that passed the checks: what the router needs of it."""

    body: dict
    streaming: bool
    include_usage: bool
    """The client asked for the usage chunk (the engine is always asked)."""
    prompt: str
    """The prompt's text, for prefix affinity (messages joined with their roles)."""
    max_tokens: int | None


_KINDS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/v1/embeddings": "input"}


def _text(value, param: str) -> str:
    """The text of a prompt, message content or embedding input; 400 if it has none."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
                parts.append(item["text"])
            elif isinstance(item, dict) and "type" in item:
                continue  # images and other parts: passed on, not hashed
            elif isinstance(item, int):
                parts.append(str(item))  # token ids
            else:
                raise _bad(f"'{param}[{i}]' must be a string or a content part with a 'type'.", f"{param}[{i}]")
        return "\n".join(parts)
    raise _bad(f"'{param}' must be a string or a list, not {type(value).__name__}.", param)


def check_request(path: str, body: object, model: Model, max_n: int = 4) -> Checked:
    """The checks every request passes before an engine sees it: its shape and types, and
    numbers the model cannot honour (a longer answer than its longest, more than its context)."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", code="invalid_body")
    kind = _KINDS[path]
    if kind not in body:
        raise _bad(f"The request needs '{kind}'.", kind, "missing_field")
    if kind == "messages":
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content}.", "messages")
        texts = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"'messages[{i}]' must be an object with a 'role' (a string).", f"messages[{i}]")
            content = m.get("content")
            texts.append(m["role"] + ": " + ("" if content is None else _text(content, f"messages[{i}].content")))
        prompt = "\n".join(texts)
    else:
        prompt = _text(body[kind], kind)
    for name in ("stream", "echo", "logprobs"):
        if name in body and not isinstance(body[name], bool) and body[name] is not None:
            raise _bad(f"'{name}' must be true or false.", name)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"'{name}' must be a number.", name)
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n):
        raise _bad(f"'n' must be a whole number from 1 to {max_n}.", "n")
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"'{name}' must be a whole number of at least 1.", name)
        longest = min(model.max_output or model.context, model.context)
        if value > longest:
            why = "its longest answer" if model.max_output and model.max_output <= model.context else "its context"
            raise _bad(
                f"'{name}' is {value}, but model '{model.name}' gives at most {longest} tokens ({why}); "
                f"ask for {longest} or fewer.",
                name,
                "max_tokens_too_large",
            )
        max_tokens = value
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options")
    streaming = bool(body.get("stream"))
    return Checked(
        body=body,
        streaming=streaming,
        include_usage=bool((options or {}).get("include_usage")),
        prompt=prompt,
        max_tokens=max_tokens,
    )


_CHAT_TOKENIZE = (
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "tools",
)


def tokenize_request(path: str, body: dict, model: str) -> dict | list[int] | None:
    """What to ask an engine's /tokenize (vLLM's) so its answer is this request's prompt as the
    engine will see it; the token ids themselves where the client sent them; None where there
    is no one prompt (embeddings, a batch of prompts)."""
    if path == "/v1/chat/completions":
        return {"model": model, **{k: body[k] for k in _CHAT_TOKENIZE if k in body}}
    if path != "/v1/completions":
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return {"model": model, "prompt": prompt} if isinstance(prompt, str) else None


def context_of(model: Model, profile: Profile) -> int:
    """Tokens one request may hold on a replica of `profile`: llama-server splits its context
    between its slots; vLLM gives any one request the whole of it."""
    return model.context // profile.slots if profile.engine == "llamacpp" else model.context


TOKENS_PER_BYTE = 3
"""The most tokens a byte of text becomes: a byte-fallback vocabulary spells a SentencePiece
space marker (3 bytes of UTF-8) as 3 tokens; every other tokenizer gives fewer."""


def may_exceed(checked: Checked, limit: int) -> bool:
    """Whether the prompt and the answer it asks for might not fit in `limit` tokens: False only
    when even the most tokens its text could become, with a chat template's markers (a few
    tokens a message and its tools) added, fit. Only then is the prompt worth tokenizing."""
    body = checked.body
    markers = 64 + 32 * len(body.get("messages") or ()) + len(msgspec.json.encode(body.get("tools") or []))
    return len(checked.prompt.encode()) * TOKENS_PER_BYTE + markers + (checked.max_tokens or 1) > limit


def check_context(prompt_tokens: int, max_tokens: int | None, context: int, model: str, path: str) -> None:
    """400 where the prompt and the answer it asks for cannot fit in the model's context."""
    answer = max_tokens or 1
    if prompt_tokens + answer > context:
        param = "messages" if path == "/v1/chat/completions" else "prompt"
        raise ApiError(
            400,
            f"The prompt is {prompt_tokens} tokens and asks for up to {answer} more, but model "
            f"'{model}' holds {context} tokens in all; shorten the prompt or lower max_tokens.",
            "invalid_request_error",
            "context_length_exceeded",
            param,
        )


def usage_of(answer: dict) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens from an answer's usage (OpenAI's fields, or
    llama-server's timings where usage lacks the cached count)."""
    usage = answer.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None and isinstance(answer.get("timings"), dict):
        cached = answer["timings"].get("cache_n")
    return prompt, int(cached or 0), int(usage.get("completion_tokens") or 0)


def rewrite_chunk(chunk: dict, model: str, include_usage: bool) -> bytes | None:
    """One answer (or SSE `data:` chunk) as the client should see it: named as the client asked,
    without the engine's timings; None drops it.

    The engine is always asked for usage; a client that did not ask gets none of it.
    """
    chunk["model"] = model
    if not include_usage and "usage" in chunk:
        if not chunk.get("choices"):
            return None
        del chunk["usage"]
    chunk.pop("timings", None)
    return msgspec.json.encode(chunk)


def sum_usage(records: list[UsageRecord], group_by: str) -> list[UsageRow]:
    """Usage records summed per value of `group_by` (model, project, key or replica), biggest first."""
    rows: dict[str, UsageRow] = {}
    for r in records:
        group = getattr(r, group_by)
        row = rows.setdefault(group, UsageRow(group=group))
        row.requests += 1
        row.errors += r.status >= 400
        row.prompt_tokens += r.prompt_tokens
        row.cached_tokens += r.cached_tokens
        row.completion_tokens += r.completion_tokens
    return sorted(rows.values(), key=lambda row: (-(row.prompt_tokens + row.completion_tokens), row.group))
