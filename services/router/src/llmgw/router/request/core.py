"""The router's rules, without I/O: checking a request before any engine sees it, its context,
reading usage and rewriting answers and stream events. Picking a replica is `balance.py`, the
errors `errors.py`."""

from __future__ import annotations

import re

import msgspec

from llmgw.proto import Model, Profile, UsageRecord, UsageRow, usage_order
from llmgw.router.errors import ContextTooLong, InvalidBody, InvalidRequest, MaxTokensTooLarge, MissingField
from llmgw.router.routing.balance import prompt_blocks

__all__ = [
    "Prepared",
    "Usage",
    "answer_of",
    "bucket_start",
    "check_context",
    "check_request",
    "context_of",
    "cut_usage",
    "fold_usage",
    "input_too_long",
    "may_exceed",
    "prompt_bound",
    "reservation",
    "rewrite_chunk",
    "sum_usage",
    "tokenize_request",
    "usage_of",
]


class Prepared(msgspec.Struct, kw_only=True):
    """A request that passed every check before admission: what forwarding it needs."""

    path: str
    """The OpenAI route ('/v1/chat/completions')."""
    model: Model
    """The model it asked for (by name or alias)."""
    body: dict
    """Its body as the engine gets it: a stream always asks for the usage chunk."""
    streaming: bool
    include_usage: bool
    """The client asked for the usage chunk (the engine is always asked)."""
    prompt: str
    """The prompt's text, for prefix affinity (messages joined with their roles)."""
    max_tokens: int | None
    blocks: list[bytes]
    """The prompt's hashed blocks, for prefix affinity (none for embeddings)."""
    size: int = 0
    """Bytes of the text its blocks were cut from (what a replica holding none of it reads)."""
    measured: bool = False
    """Whether its model had ready replicas when it was prepared: its prompt was measured (and
    checked against the context) before admission; else it is once the model woke."""
    tokens: list[int] | None = None
    """The prompt's tokens from that measure, where they were needed."""
    adapter: str = ""
    """The model's LoRA adapter it asked for (`MODEL:ADAPTER`); "": none."""
    trace: dict[str, str] | None = None
    """The headers that carry its span to the engine (a traceparent); None: not traced."""


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
            elif isinstance(item, dict) and item.get("type") == "text":
                if not isinstance(item.get("text"), str):
                    where = f"{param}[{i}].text"
                    raise InvalidRequest(f"'{where}' must be a string: the part's text.", where)
                parts.append(item["text"])
            elif isinstance(item, dict) and "type" in item:
                continue  # images and other parts: passed on, not hashed
            elif isinstance(item, int):
                parts.append(str(item))  # token ids
            else:
                raise InvalidRequest(
                    f"'{param}[{i}]' must be a string or a content part with a 'type'.", f"{param}[{i}]"
                )
        return "\n".join(parts)
    raise InvalidRequest(f"'{param}' must be a string or a list, not {type(value).__name__}.", param)


def check_request(path: str, body: object, model: Model, max_n: int = 4) -> Prepared:
    """The checks every request passes before an engine sees it: its shape and types, and
    numbers the model cannot honour (a longer answer than its longest, more than its context)."""
    if not isinstance(body, dict):
        raise InvalidBody("The request body must be a JSON object.")
    kind = _KINDS[path]
    if kind not in body:
        raise MissingField(f"The request needs '{kind}'.", kind)
    prompt = _messages_text(body["messages"]) if kind == "messages" else _text(body[kind], kind)
    _check_types(body, max_n)
    max_tokens = _max_tokens(body, model)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", "stream_options")
    streaming = bool(body.get("stream"))
    if streaming:  # the engine is always asked for the usage chunk; the client gets it if it asked
        body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
    return Prepared(
        path=path,
        model=model,
        body=body,
        streaming=streaming,
        include_usage=bool((options or {}).get("include_usage")),
        prompt=prompt,
        max_tokens=max_tokens,
        blocks=prompt_blocks(prompt) if path != "/v1/embeddings" else [],
        size=len(prompt.encode()),
    )


def _messages_text(messages: object) -> str:
    """A chat's text: each message's role and content, one a line."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of {role, content}.", "messages")
    texts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(f"'messages[{i}]' must be an object with a 'role' (a string).", f"messages[{i}]")
        content = m.get("content")
        texts.append(m["role"] + ": " + ("" if content is None else _text(content, f"messages[{i}].content")))
    return "\n".join(texts)


def _check_types(body: dict, max_n: int) -> None:
    """The flags are booleans, the sampling settings numbers, `n` within 1..max_n."""
    for name in ("stream", "echo", "logprobs"):
        if name in body and not isinstance(body[name], bool) and body[name] is not None:
            raise InvalidRequest(f"'{name}' must be true or false.", name)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidRequest(f"'{name}' must be a number.", name)
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n):
        raise InvalidRequest(f"'n' must be a whole number from 1 to {max_n}.", "n")


def _max_tokens(body: dict, model: Model) -> int | None:
    """The longest answer asked for, if the model gives it (its longest answer, within its context)."""
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"'{name}' must be a whole number of at least 1.", name)
        longest = min(model.max_output or model.context, model.context)
        if value > longest:
            why = "its longest answer" if model.max_output and model.max_output <= model.context else "its context"
            raise MaxTokensTooLarge(
                f"'{name}' is {value}, but model '{model.name}' gives at most {longest} tokens ({why}); "
                f"ask for {longest} or fewer.",
                name,
            )
        max_tokens = value
    return max_tokens


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


def prompt_bound(prepared: Prepared) -> int:
    """The most tokens the prompt could become: its text at the most tokens a byte, with a chat
    template's markers (a few tokens a message and its tools) added."""
    body = prepared.body
    markers = 64 + 32 * len(body.get("messages") or ()) + len(msgspec.json.encode(body.get("tools") or []))
    return len(prepared.prompt.encode()) * TOKENS_PER_BYTE + markers


def may_exceed(prepared: Prepared, limit: int) -> bool:
    """Whether the prompt and the answer it asks for might not fit in `limit` tokens: False only
    when even the most tokens its text could become (`prompt_bound`) fit. Only then is the
    prompt worth tokenizing."""
    return prompt_bound(prepared) + (prepared.max_tokens or 1) > limit


def reservation(prepared: Prepared) -> int:
    """The most tokens a request may use, held against its key's token limits while it runs: its
    prompt (as measured, else its bound) and, for each prompt and choice, the answer it asked for
    or else the model's longest; a prompt and its answer within the model's context."""
    model, body = prepared.model, prepared.body
    prompt = len(prepared.tokens) if prepared.tokens is not None else prompt_bound(prepared)
    if prepared.path == "/v1/embeddings":
        return prompt
    answer = prepared.max_tokens or min(model.max_output or model.context, model.context)
    asked = body.get("prompt")
    prompts = len(asked) if isinstance(asked, list) and asked and all(isinstance(p, str) for p in asked) else 1
    choices = body.get("n") or 1
    return min(prompt + answer * prompts, model.context * prompts) + answer * prompts * (choices - 1)


def check_context(prompt_tokens: int, max_tokens: int | None, context: int, model: str, path: str) -> None:
    """400 where the prompt and the answer it asks for cannot fit in the model's context."""
    answer = max_tokens or 1
    if prompt_tokens + answer > context:
        param = "messages" if path == "/v1/chat/completions" else "prompt"
        raise ContextTooLong(
            f"The prompt is {prompt_tokens} tokens and asks for up to {answer} more, but model "
            f"'{model}' holds {context} tokens in all; shorten the prompt or lower max_tokens.",
            param,
        )


_TOO_LARGE = re.compile(rb"input \((\d+) tokens\) is too large")


def input_too_long(raw: bytes) -> int | None:
    """The tokens of an embedding input llama-server found too long to embed at once (its 500
    says so), or None: the engine failed for another reason."""
    found = _TOO_LARGE.search(raw[:2000])
    return int(found.group(1)) if found else None


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


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens one request used, as its engine said."""

    prompt: int = 0
    cached: int | None = None
    """Prompt tokens served from the engine's cache; None: it did not say."""
    completion: int = 0
    prompt_ms: float | None = None
    """What the engine says reading the prompt took (llama-server's timings); None: not said."""
    generation_ms: float | None = None
    """What it says generating the answer took."""

    @property
    def total(self) -> int:
        """Prompt and completion tokens: what limits count."""
        return self.prompt + self.completion


def cut_usage(prepared: Prepared, relayed: int) -> Usage:
    """What a stream cut before its engine said its usage (the client left, the engine failed)
    is billed: its prompt (as measured, else a quarter of its bytes: English runs about four
    to a token) and a token for each chunk relayed (llama-server sends one a token)."""
    prompt = len(prepared.tokens) if prepared.tokens is not None else -(-len(prepared.prompt.encode()) // 4)
    return Usage(prompt=prompt, completion=relayed)


def _timed(seen: Usage, answer: dict) -> Usage:
    """`seen` with the time llama-server's timings say the prompt and the answer took."""
    timings = answer.get("timings")
    if not isinstance(timings, dict):
        return seen
    prompt_ms, generation_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
    return msgspec.structs.replace(
        seen,
        prompt_ms=float(prompt_ms) if isinstance(prompt_ms, int | float) else seen.prompt_ms,
        generation_ms=float(generation_ms) if isinstance(generation_ms, int | float) else seen.generation_ms,
    )


def fold_usage(seen: Usage, chunk: dict) -> Usage:
    """The usage of a stream so far, with what one of its chunks says (the usage chunk, or
    llama-server's timings on any chunk)."""
    if not (chunk.get("usage") or chunk.get("timings")):
        return seen
    prompt, cached, completion = usage_of(chunk)
    if chunk.get("usage"):
        seen = msgspec.structs.replace(seen, prompt=prompt, completion=completion)
    seen = msgspec.structs.replace(seen, cached=cached if cached or seen.cached is None else seen.cached)
    return _timed(seen, chunk)


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


def bucket_start(t: float, bucket_s: int) -> float:
    """Where the time bucket `bucket_s` seconds long that holds `t` starts (buckets start at the
    multiples of `bucket_s` since 1970); 0 where `bucket_s` is 0 (one bucket: all time)."""
    return float(int(t // bucket_s) * bucket_s) if bucket_s else 0.0


def sum_usage(records: list[UsageRecord], group_by: str, bucket_s: int = 0) -> list[UsageRow]:
    """Usage records summed per value of `group_by` (model, project, key or replica), biggest
    first; with `bucket_s`, per group and time bucket (`bucket_start`), oldest bucket first."""
    rows: dict[tuple[float, str], UsageRow] = {}
    for r in records:
        group, start = getattr(r, group_by), bucket_start(r.time, bucket_s)
        row = rows.setdefault((start, group), UsageRow(group=group, start=start))
        row.requests += 1
        row.errors += r.status >= 400
        row.prompt_tokens += r.prompt_tokens
        row.cached_tokens += r.cached_tokens
        row.completion_tokens += r.completion_tokens
    return usage_order(list(rows.values()))


def answer_of(raw: bytes, model: str) -> tuple[bytes, Usage]:
    """A whole (not streamed) answer as the client gets it (named as it asked) and its usage."""
    try:
        answer = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw, Usage()
    if not isinstance(answer, dict):
        return raw, Usage()
    prompt, cached, completion = usage_of(answer)  # before the rewrite, which drops the timings
    usage = _timed(Usage(prompt=prompt, cached=cached, completion=completion), answer)
    return rewrite_chunk(answer, model, include_usage=True) or raw, usage
