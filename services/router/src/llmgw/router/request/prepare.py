"""Preparing a request before it is admitted, pure: whose key it is, its size, its JSON, its
model, whether the key may use it, the request's own checks, and which replica tokenizes its
prompt for the context check. Nothing here is counted against a limit: a request refused here
spends none of its key's. The clock is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import msgspec

from llmgw.proto import JSON_MAX_DEPTH, JsonTooDeep, KeyRecord, Model, Profile, ReplicaState, check_depth, decode_json
from llmgw.router.accounts.limits import Verdict
from llmgw.router.errors import (
    ApiError,
    BodyTooLarge,
    BudgetSpent,
    InvalidJson,
    InvalidRequest,
    MissingModel,
    ModelNotAllowed,
    ModelNotFound,
    NestedTooDeep,
    NotServed,
    RateLimited,
    UnsupportedMediaType,
)
from llmgw.router.request.adapters import SEPARATOR, adapter_of, no_such_adapter
from llmgw.router.request.core import Prepared, check_request, context_of, may_exceed
from llmgw.router.routing.balance import prompt_blocks

__all__ = [
    "Measure",
    "check_body",
    "check_prompts",
    "check_size",
    "check_tenant",
    "measure_plan",
    "prepare",
    "refusal",
    "resolve",
]


def check_size(content_length: str | None, most: int) -> None:
    """413 for a body its length says is beyond `most` bytes, before it is read."""
    if content_length and content_length.isdigit() and int(content_length) > most:
        raise BodyTooLarge(f"The request body is {int(content_length)} bytes; the most this router takes is {most}.")


def _nested_too_deep() -> NestedTooDeep:
    return NestedTooDeep(
        f"The request body is JSON nested deeper than {JSON_MAX_DEPTH} levels (arrays and objects one "
        "inside another); the router reads no deeper."
    )


def check_body(content_type: str | None, raw: bytes) -> None:
    """A body the router can read: sent as JSON (or with no type: read as JSON; 415 for any
    other), and nested no deeper than `JSON_MAX_DEPTH` (400). An empty body passes."""
    if not raw:
        return
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaType(
            f"The body is sent as '{media}', and this API reads JSON only: "
            "send 'Content-Type: application/json' with a JSON body."
        )
    try:
        check_depth(raw)
    except JsonTooDeep:
        raise _nested_too_deep() from None


def resolve(raw: bytes, models: Callable[[str], Model | None]) -> tuple[dict, str, Model]:
    """The body's JSON, the name it asks for and the model that name is (`models` looks it up)."""
    try:
        body = decode_json(raw)
    except JsonTooDeep:
        raise _nested_too_deep() from None
    except msgspec.DecodeError as exc:
        raise InvalidJson(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise MissingModel("The request needs a 'model' (a string).", "model")
    asked = body["model"]
    model = models(asked) or (models(asked.partition(SEPARATOR)[0]) if SEPARATOR in asked else None)
    if model is None:  # an adapter not attached is said once the key may use the model (`prepare`)
        raise ModelNotFound(f"The model '{asked}' does not exist; GET /v1/models lists them.", "model")
    return body, asked, model


def check_tenant(asked: str, model: Model, key: KeyRecord, tenant_models: list[str]) -> None:
    """Whether the key's tenant may use the model (`tenant_models`: what it may use; empty: every one)."""
    if tenant_models and asked not in tenant_models and model.name not in tenant_models:
        raise ModelNotAllowed(
            f"The tenant '{key.tenant}' may not use model '{asked}'; it may use {', '.join(tenant_models)}.", "model"
        )


def prepare(path: str, body: dict, asked: str, model: Model, key: KeyRecord, max_n: int) -> Prepared:
    """Whether the key may use the model, and the request's own checks (`core.check_request`)."""
    if key.models and asked not in key.models and model.name not in key.models:
        raise ModelNotAllowed(f"This key may not use model '{asked}'; it may use {', '.join(key.models)}.", "model")
    if model.kind == "embedding" and path != "/v1/embeddings":  # its engine has no language head to answer with
        raise NotServed(f"model '{asked}' is an embedding model: it does not serve {path}; ask /v1/embeddings", "model")
    if (adapter := adapter_of(asked)) and not any(a.name == adapter for a in model.adapters):
        raise no_such_adapter(asked, model)
    prepared = check_request(path, body, model, max_n)
    if adapter:  # its own prompts' blocks: an adapter makes its own cache
        text = f"{adapter}\n{prepared.prompt}"
        blocks = prompt_blocks(text) if prepared.blocks else []
        prepared = msgspec.structs.replace(prepared, adapter=adapter, blocks=blocks, size=len(text.encode()))
    return prepared


def check_prompts(prepared: Prepared, most: int) -> None:
    """A completion asks for at most `most` prompts at once (a list of strings is one prompt
    each; a list of token ids is one prompt): 400 saying the bound."""
    prompt = prepared.body.get("prompt") if prepared.path == "/v1/completions" else None
    if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt) and len(prompt) > most:
        raise InvalidRequest(
            f"'prompt' may hold at most {most} prompts; this one has {len(prompt)}: send the rest in more requests.",
            "prompt",
        )


class Measure(NamedTuple):
    """Which replica tokenizes a prompt, and the context it must fit in."""

    replica: ReplicaState
    profile: Profile
    limit: int
    """Tokens one request may hold on the model's roomiest ready replica."""
    check: bool
    """Whether the count decides a 400 (the asked-for model, not a fallback)."""


def measure_plan(
    prepared: Prepared, model: Model, ready: Iterable[tuple[ReplicaState, Profile]], primary: bool
) -> Measure | None:
    """Whether `model`'s ready replicas need the prompt's tokens, and whose: for the context check
    of the asked-for model where the prompt might not fit (only a long prompt is worth it), and
    for replicas that publish KV events (what their caches hold is known in tokens). A replica
    with KV events tokenizes; else any."""
    ready = list(ready)
    if not ready or prepared.path == "/v1/embeddings":
        return None
    limit = max(context_of(model, p) for _, p in ready)
    kv = any(r.kv_events for r, _ in ready)
    if not kv and not (primary and may_exceed(prepared, limit)):
        return None
    replica, profile = next(((r, p) for r, p in ready if r.kv_events), ready[0])
    return Measure(replica, profile, limit, primary)


def refusal(verdict: Verdict) -> ApiError:
    """The 429 for a limit that refused a request: which limit, when it resets, whether to retry."""
    headers = {**verdict.headers, "retry-after": f"{max(1, round(verdict.reset_s))}"}
    if not verdict.retry:
        headers["x-should-retry"] = "false"
    kind = RateLimited if verdict.retry else BudgetSpent
    return kind(f"Rate limit: {verdict.limit}; it resets in {verdict.reset_s:.0f}s.", headers=headers)
