"""A chat completion and the answer cache: looked up before the request goes to a replica (a hit
is answered at once, as the original was, marked in a header and in usage), and its answer kept
after (a stream as its events went by). The cache never fails a request: where its embedding
model cannot embed the question, the request goes on uncached, said in the log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import NamedTuple

import msgspec
import numpy as np

from llmgw.bus import get_logger
from llmgw.proto.knowledge import AnswerCache, CachedAnswer
from llmgw.router.errors import ApiError
from llmgw.router.knowledge.answers import Answers
from llmgw.router.knowledge.recall import (
    CACHE_HEADER,
    SAVED_HEADER,
    completion_of,
    conversation_text,
    eligible,
    events_of,
    streamed_content,
    variant_of,
)
from llmgw.router.request.relay import Answer, Relay

__all__ = ["CACHE_REPLICA", "Recall", "Replay", "kept_answer", "recall", "replayed"]

CACHE_REPLICA = "answer-cache"
"""The replica a request answered from the answer cache is counted under (usage, the log)."""

_log = get_logger("router.cache")
_background: set[asyncio.Task] = set()


class Recall(NamedTuple):
    """A request the answer cache looked at: its policy, the conversation's text and vector, what
    else of it an answer must match (its variant), and the answer kept for it (and how close), if
    any."""

    policy: AnswerCache
    question: str
    vector: np.ndarray
    variant: str
    hit: tuple[CachedAnswer, float] | None


class Replay(Relay):
    """A kept answer streamed again (what the endpoint writes as it writes a relay)."""

    def __init__(self, events: bytes, headers: dict[str, str]) -> None:
        async def once() -> AsyncGenerator[bytes, None]:
            yield events

        self.chunks = once()
        self.headers = {**headers, "content-type": "text/event-stream", "cache-control": "no-cache"}

    async def close(self) -> None:
        """Nothing held."""
        await self.chunks.aclose()


async def recall(
    answers: Answers, embed: Callable, body: dict, whose: tuple[str, str], mode: str, knowledge: str
) -> Recall | None:
    """The answer cache's look at a chat completion to `whose` (tenant, model), answered from
    `knowledge` (a knowledge base as it is now, or ""): None where its answers are not kept, it
    is not eligible, or its question could not be embedded."""
    tenant, model = whose
    policy = answers.policy(tenant, model)
    if policy is None or not eligible(policy, body, mode):
        return None
    question = conversation_text(body)
    try:
        vector = (await embed(policy.embedding, [question], tenant))[0]
    except ApiError as exc:
        _log.warning("answer cache skipped: the question could not be embedded", model=model, why=exc.message)
        return None
    variant = variant_of(body, knowledge)
    return Recall(policy, question, vector, variant, answers.lookup(policy, vector, variant))


def replayed(hit: tuple[CachedAnswer, float], model: str, stream: bool, include_usage: bool) -> Answer | Relay:
    """A hit as the answer asked for, marked as one."""
    kept, score = hit
    headers = {CACHE_HEADER: f"hit; score={score:.3f}", SAVED_HEADER: str(kept.prompt_tokens + kept.completion_tokens)}
    if stream:
        return Replay(events_of(kept, model, include_usage, int(time.time())), headers)
    return Answer(200, completion_of(kept, model, int(time.time())), headers)


def kept_answer(answers: Answers, seen: Recall, answer: Answer | Relay) -> Answer | Relay:
    """`answer` with its text kept for `seen`'s question once it ended well (a stream at its end)."""
    answer.headers[CACHE_HEADER] = "miss"
    if isinstance(answer, Answer):
        if answer.status == 200:
            kept = _of_completion(answer.body)
            if kept is not None:
                _keep(answers, seen, kept)
        return answer
    answer.chunks = _teed(answer.chunks, lambda events: _keep_stream(answers, seen, events))
    return answer


def _keep_stream(answers: Answers, seen: Recall, events: bytes) -> None:
    said = streamed_content(events)
    if said is not None:
        kept = CachedAnswer(
            question="", embedded_with="", vector=b"", content=said[0], finish_reason=said[1], events=events,
            prompt_tokens=_usage(events, "prompt_tokens"), completion_tokens=_usage(events, "completion_tokens"),
            time=time.time(),
        )  # fmt: skip
        _keep(answers, seen, kept)


def _keep(answers: Answers, seen: Recall, kept: CachedAnswer) -> None:
    _spawn(answers.keep(seen.policy, seen.question, seen.vector, seen.variant, kept))


async def _teed(chunks: AsyncGenerator[bytes, None], ended: Callable[[bytes], None]) -> AsyncGenerator[bytes, None]:
    """The stream passed on, and its events given to `ended` where it was read to its end."""
    seen: list[bytes] = []
    try:
        async for piece in chunks:
            seen.append(piece)
            yield piece
    finally:
        await chunks.aclose()
    ended(b"".join(seen))


def _of_completion(body: bytes) -> CachedAnswer | None:
    """What is kept of a chat completion (None: not one answer of text)."""
    try:
        data = msgspec.json.decode(body)
        (choice,) = data["choices"]
        content = choice["message"]["content"]
        usage = data.get("usage") or {}
    except (msgspec.DecodeError, KeyError, TypeError, ValueError):
        return None
    if not isinstance(content, str) or choice["message"].get("tool_calls"):
        return None
    return CachedAnswer(
        question="", embedded_with="", vector=b"", content=content, finish_reason=choice.get("finish_reason") or "stop",
        prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        time=time.time(),
    )  # fmt: skip


def _usage(events: bytes, field: str) -> int:
    """A stream's usage chunk's `field` (0: it had none)."""
    at = events.rfind(f'"{field}":'.encode())
    if at < 0:
        return 0
    digits = events[at + len(field) + 3 :].split(b",", 1)[0].split(b"}", 1)[0].strip()
    return int(digits) if digits.isdigit() else 0


def _spawn(work) -> None:
    task = asyncio.ensure_future(work)
    _background.add(task)
    task.add_done_callback(_background.discard)
