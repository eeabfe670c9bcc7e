"""Which guardrail policy a request meets and what its checks do to it, without I/O: the
narrowest policy of the request's tenant (its key's, else its project's, the tenant's own, else
its model's), its input checks run over every text of the request (chat messages, prompts) and
its output checks over a whole answer's texts, each finding blocked, redacted or recorded."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

from llmgw.proto.guard import Check, Policy
from llmgw.router.guard.find import Found, compile_pattern, find, find_pattern
from llmgw.router.guard.redact import Redaction

__all__ = ["Blocked", "Index", "Outcome", "answer_texts", "check_texts", "index", "narrowest", "request_texts", "spans"]

Index = dict[tuple[str, str, str], Policy]
"""(applies_to, tenant, target) -> the policy attached there."""


class Blocked(NamedTuple):
    """A request or answer a check refused: which policy, which category (never the text)."""

    policy: str
    category: str


class Outcome(NamedTuple):
    """What a policy's checks did: the first block (None: none), and each finding as
    (category, action), in order."""

    blocked: Blocked | None
    seen: list[tuple[str, str]]


def index(policies: Mapping[str, Policy]) -> Index:
    """The policies by where they are attached (built once per change of the bucket)."""
    return {(p.applies_to, p.tenant, p.target if p.applies_to != "tenant" else ""): p for p in policies.values()}


def narrowest(idx: Index, tenant: str, project: str, key_id: str, model: str) -> Policy | None:
    """The policy a request meets: its key's, else its project's, its tenant's, its model's."""
    if not idx:
        return None
    for where in (
        ("key", tenant, key_id),
        ("project", tenant, project),
        ("tenant", tenant, ""),
        ("model", tenant, model),
    ):
        if (found := idx.get(where)) is not None:
            return found
    return None


def _findings(text: str, check: Check, patterns: dict[str, object]) -> list[Found]:
    if check.kind == "pii":
        return find(text, check.entities)
    compiled = patterns.get(check.pattern)
    if compiled is None:
        compiled = patterns[check.pattern] = compile_pattern(check.pattern)
    return find_pattern(text, compiled, check.label or "PATTERN")


def check_texts(
    texts: list[str], checks: list[Check], name: str, redaction: Redaction, patterns: dict
) -> tuple[list[str], Outcome]:
    """`texts` after `checks` (of the policy `name`): redacted where a check redacts; the first
    block stops there. `patterns`: the compiled tenant patterns, filled as they are met."""
    seen: list[tuple[str, str]] = []
    out = list(texts)
    for check in checks:
        for i, text in enumerate(out):
            found = _findings(text, check, patterns)
            seen += [(f.category, check.action) for f in found]
            if found and check.action == "block":
                return out, Outcome(Blocked(name, found[0].category), seen)
            if found and check.action == "redact":
                out[i] = redaction.redact(text, found)
    return out, Outcome(None, seen)


def spans(text: str, checks: list[Check], patterns: dict) -> list[tuple[int, int]]:
    """Where the local `checks` find something in `text`: (start, end) each."""
    return [(f.start, f.end) for check in checks for f in _findings(text, check, patterns)]


def _parts(holder: dict, key: str) -> Iterator[tuple[dict, str | int]]:
    """Where the texts of one message's content are: (the dict or list holding it, its key)."""
    content = holder.get(key)
    if isinstance(content, str):
        yield holder, key
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                yield part, "text"


def request_texts(body: dict) -> list[tuple[dict, str | int]]:
    """Every text a request sends a model: its messages' contents, its prompt or prompts."""
    places: list[tuple[dict, str | int]] = []
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            places += _parts(message, "content")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        places.append((body, "prompt"))
    elif isinstance(prompt, list):
        places += [(prompt, i) for i, p in enumerate(prompt) if isinstance(p, str)]  # type: ignore[misc]
    return places


def answer_texts(answer: dict) -> list[tuple[dict, str | int]]:
    """Every text of a whole answer: its choices' message contents, or their texts."""
    places: list[tuple[dict, str | int]] = []
    for choice in answer.get("choices") or []:
        if isinstance(choice, dict):
            if isinstance(choice.get("message"), dict):
                places += _parts(choice["message"], "content")
            if isinstance(choice.get("text"), str):
                places.append((choice, "text"))
    return places
