"""A request under a guardrail policy: its texts checked before it is admitted (a block refused
saying the policy and the category, never the text, and spending nothing of its key's limits;
redacted values replaced by placeholders the engine sees), and its answer's texts checked and
the values put back, whole or streamed (a placeholder split across chunks held until whole)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from urllib.parse import urlsplit

import msgspec

from llmgw.proto.guard import Check, Policy, ServiceAsk, ServiceVerdict
from llmgw.router.errors import ApiError
from llmgw.router.guard.find import Found
from llmgw.router.guard.judge import GRAMMARS, JudgeGarbage, judge_messages, parse_verdict
from llmgw.router.guard.policies import Blocked, answer_texts, check_texts, request_texts, spans
from llmgw.router.guard.redact import CheckWindow, Redaction, StreamRestorer
from llmgw.router.guard.store import Guards, JudgeUnavailable
from llmgw.router.request.relay import Answer, Relay

__all__ = ["BIG_TEXT", "GuardBlocked", "Tally", "guard_answer", "guard_request", "guard_texts"]

BIG_TEXT = 64 * 1024
"""Characters past which a request's texts are checked in a worker thread (a megabyte full of
phone numbers takes libphonenumber about two seconds)."""
Tally = Callable[[str, list[tuple[str, str]]], None]
"""Told what a policy's checks found: its name, and (category, action) each."""


class GuardBlocked(ApiError):
    """A request (or its answer) a guardrail policy blocked: named with its category, never the text."""

    status, type, code = 400, "invalid_request_error", "guardrail_blocked"


def _refused(blocked: Blocked, what: str) -> GuardBlocked:
    return GuardBlocked(
        f"The {what} was blocked by guardrail policy '{blocked.policy}': it holds {blocked.category}. "
        "Leave it out, or ask an operator about the policy."
    )


_WHAT = {"input": "request", "output": "answer", "tool input": "tool call", "tool output": "tool's result"}
"""What a blocked text is said to be, by the way it was checked."""


async def guard_request(policy: Policy, body: dict, guards: Guards, tally: Tally) -> Redaction:
    """Run the policy's input checks over the request's texts, redacting them in `body` in place
    (an outside service is asked last, about texts already redacted); GuardBlocked where one
    blocks. The request's redaction (empty: nothing redacted); what was found told to `tally`."""
    redaction = Redaction()
    if not policy.input:
        return redaction
    places = request_texts(body)
    texts = [holder[key] for holder, key in places]  # type: ignore[index]
    texts = await guard_texts(texts, policy, "input", guards, redaction, tally)
    for (holder, key), text in zip(places, texts, strict=True):
        holder[key] = text  # type: ignore[index]
    return redaction


async def guard_texts(
    texts: list[str], policy: Policy, way: str, guards: Guards, redaction: Redaction, tally: Tally
) -> list[str]:
    """`texts` after the policy's checks of that `way` (input, output; a tool's: tool input,
    tool output): the local ones, then each outside service's; GuardBlocked where one blocks."""
    what = _WHAT[way]
    checks = policy.input if way.endswith("input") else policy.output
    local = [c for c in checks if c.kind in ("pii", "pattern")]
    args = (texts, local, policy.name, redaction, guards.patterns)
    big = sum(map(len, texts)) > BIG_TEXT  # a long prompt is checked beside the loop, not on it
    out, outcome = await asyncio.to_thread(check_texts, *args) if big else check_texts(*args)
    tally(policy.name, outcome.seen)
    if outcome.blocked is not None:
        raise _refused(outcome.blocked, what)
    for check in (c for c in checks if c.kind == "judge"):
        await _judged(out, policy, check, guards, what, tally)
    for check in (c for c in checks if c.kind == "service"):
        ask = ServiceAsk(texts=out, direction=way.split()[-1], policy=policy.name, tenant=policy.tenant)  # type: ignore[arg-type]
        verdict = await guards.ask_service(check, ask)
        if isinstance(verdict, str):
            tally(policy.name, [("SERVICE_DOWN", check.on_error)])
            if check.on_error == "block":
                raise GuardBlocked(
                    f"The {what} was blocked by guardrail policy '{policy.name}': its guardrail service "
                    f"{urlsplit(check.url).netloc} failed ({verdict}) and the policy fails closed. Try again later."
                )
            continue
        if verdict.verdict == "block":
            tally(policy.name, [(verdict.category or "SERVICE", "block")])
            raise _refused(Blocked(policy.name, verdict.category or "what its guardrail service refuses"), what)
        out = _spans(out, verdict, check, redaction)
        tally(policy.name, [(s.category, check.action) for s in verdict.spans])
    return out


async def _judged(texts: list[str], policy: Policy, check: Check, guards: Guards, what: str, tally: Tally) -> None:
    """Ask the check's judge about each text (through the router's own routing); GuardBlocked
    where it finds one unsafe, or where it cannot say and the policy fails closed."""
    assert guards.ask_judge is not None
    for text in texts:
        try:
            said = await guards.ask_judge(
                check.judge, judge_messages(text, check.judge_format), GRAMMARS[check.judge_format], policy.tenant
            )
            verdict = parse_verdict(said, check.judge_format)
        except (JudgeUnavailable, JudgeGarbage) as exc:
            tally(policy.name, [("JUDGE_DOWN", check.on_error)])
            if check.on_error == "pass":
                continue
            raise GuardBlocked(
                f"The {what} was blocked by guardrail policy '{policy.name}': its judge {check.judge} could not "
                f"give a verdict ({exc}) and the policy fails closed. Try again later."
            ) from None
        category = (verdict.categories or ["UNSAFE"])[0]
        tally(policy.name, [(category, "block" if verdict.unsafe else "record")])
        if verdict.unsafe and check.action == "block":
            raise _refused(Blocked(policy.name, category), what)


def _spans(texts: list[str], verdict: ServiceVerdict, check: Check, redaction: Redaction) -> list[str]:
    """The texts with the spans a service found redacted (where the check redacts; spans that
    do not fit their text left out)."""
    if check.action != "redact":
        return texts
    out = list(texts)
    for i, text in enumerate(texts):
        spans = sorted(
            (s for s in verdict.spans if s.text == i and 0 <= s.start < s.end <= len(text)), key=lambda s: s.start
        )
        found, end = [], 0
        for s in spans:
            if s.start >= end:
                found.append(Found(s.start, s.end, s.category))
                end = s.end
        out[i] = redaction.redact(text, found) if found else text
    return out


async def guard_answer(
    answer: Answer | Relay, policy: Policy, redaction: Redaction, guards: Guards, tally: Tally
) -> Answer | Relay:
    """The answer with the redacted values put back and the policy's output checks run: over a
    whole answer at once; over a stream as it comes (`_StreamGuard`)."""
    if isinstance(answer, Relay):
        if redaction or policy.output:
            answer.chunks = _StreamGuard(policy, redaction, guards, tally).events(answer.chunks)
        return answer
    if answer.status != 200 or not (redaction or policy.output):
        return answer
    try:
        body = msgspec.json.decode(answer.body)
    except msgspec.DecodeError:
        return answer
    places = answer_texts(body)
    texts = [redaction.restore(holder[key]) for holder, key in places]  # type: ignore[index]
    if policy.output:
        try:
            texts = await guard_texts(texts, policy, "output", guards, Redaction(), tally)
        except GuardBlocked as exc:
            return Answer(exc.status, msgspec.json.encode(exc.body()))
    for (holder, key), text in zip(places, texts, strict=True):
        holder[key] = text  # type: ignore[index]
    return Answer(answer.status, msgspec.json.encode(body), answer.headers)


def _is_error(event: bytes) -> bool:
    """Whether an SSE event is the stream's error (an engine's, or the relay's)."""
    return event.startswith(b"event: error") or event.startswith(b'data: {"error"')


class _StreamGuard:
    """A streamed answer's events, each choice's text restored as it comes (held where a
    placeholder may be cut) and given to the output checks in pieces that cut nothing they look
    for (`CheckWindow`; whole at the end where a judge or an outside service checks it). What a
    check redacts gets placeholders numbered across the whole answer; a block ends the stream with
    an error event naming the policy and the category, after the text already checked."""

    def __init__(self, policy: Policy, redaction: Redaction, guards: Guards, tally: Tally) -> None:
        self.policy, self.redaction, self.guards, self.tally = policy, redaction, guards, tally
        self.restorers: dict[int, StreamRestorer] = {}
        self.windows: dict[int, CheckWindow] = {}
        self.chat: dict[int, bool] = {}
        """Per choice: whether its text comes in `delta.content` (chat) or `text` (completions)."""
        self.masked = Redaction()
        self.whole = any(c.kind in ("judge", "service") for c in policy.output)

    async def events(self, chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """The stream, guarded."""
        try:
            async for piece in chunks:
                out = []
                for event in piece.split(b"\n\n"):
                    if not event:
                        continue
                    try:
                        if event.strip() == b"data: [DONE]" or _is_error(event):  # what is held goes out first
                            out.append(await self._flush())
                        out.append(await self._event(event))
                    except GuardBlocked as exc:
                        yield b"".join([*out, b"data: ", msgspec.json.encode(exc.body()), b"\n\ndata: [DONE]\n\n"])
                        return
                yield b"".join(out)
            try:
                yield await self._flush()  # a stream cut short: what was held, as it stands
            except GuardBlocked as exc:
                yield b"data: " + msgspec.json.encode(exc.body()) + b"\n\n"
        finally:
            await chunks.aclose()

    async def _event(self, event: bytes) -> bytes:
        """One SSE event with its choices' texts guarded (others passed on as they came)."""
        if not event.startswith(b"data: {") or self._passes(event):
            return event + b"\n\n"
        try:
            data = msgspec.json.decode(event[6:])
        except msgspec.DecodeError:
            return event + b"\n\n"
        for choice in data.get("choices") or []:
            await self._choice(choice)
        return b"data: " + msgspec.json.encode(data) + b"\n\n"

    def _passes(self, event: bytes) -> bool:
        """Whether `event` goes on untouched: nothing to check, no placeholder in it, none held."""
        if self.policy.output or b"<" in event or b"\\u003c" in event.lower():
            return False
        return not any(r.held for r in self.restorers.values())

    async def _flush(self) -> bytes:
        """An event with what each choice still holds (b"" where none holds anything)."""
        choices = []
        for index in sorted({*self.restorers, *self.windows}):
            chat = self.chat.get(index, True)
            choice: dict = {"index": index, "finish_reason": "stop", **({"delta": {}} if chat else {})}
            await self._choice(choice)
            if choice["delta"].get("content") if chat else choice.get("text"):
                choice["finish_reason"] = None
                choices.append(choice)
        self.restorers.clear()
        self.windows.clear()
        return b"data: " + msgspec.json.encode({"choices": choices}) + b"\n\n" if choices else b""

    async def _choice(self, choice: dict) -> None:
        index, ended = choice.get("index", 0), choice.get("finish_reason") is not None
        delta = choice.get("delta")
        chat = self.chat.setdefault(index, isinstance(delta, dict) or "text" not in choice)
        if chat and not isinstance(delta, dict):
            delta = choice["delta"] = {}  # a finish without a delta: what was held goes in one
        holder, key = (delta, "content") if chat else (choice, "text")
        came = holder.get(key)
        if not isinstance(came, str) and not ended:
            return
        restorer = self.restorers.setdefault(index, StreamRestorer(self.redaction))
        text = restorer.feed(came if isinstance(came, str) else "") + (restorer.end() if ended else "")
        if self.policy.output:
            window = self.windows.get(index)
            if window is None:
                local = [c for c in self.policy.output if c.kind in ("pii", "pattern")]
                window = self.windows[index] = CheckWindow(lambda t: spans(t, local, self.guards.patterns), self.whole)
            text = window.feed(text) + (window.end() if ended else "")
            if text:
                checked = await guard_texts([text], self.policy, "output", self.guards, self.masked, self.tally)
                text = checked[0]
        if text or isinstance(came, str):
            holder[key] = text
