"""Guardrails: policies that check what goes in to a model and what comes out, attached to a
tenant, a project, a key or a model (the narrowest wins: key, project, tenant, model). Each
check finds something (personal data and secrets of known shapes, a tenant's own patterns) and
blocks the request, redacts it (the model sees a placeholder such as `<EMAIL_1>`; the client's
answer has the value put back), or only records it. The router keeps them (its `guard` bucket)
and answers these endpoints; `llmgw ctl guard`, the admin API and the console ask them."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._types import Name
from llmgw.proto.people import DEFAULT_TENANT

__all__ = [
    "ENDPOINTS",
    "ENTITIES",
    "GUARD_LIST",
    "GUARD_PUT",
    "GUARD_REMOVE",
    "Action",
    "Check",
    "Entity",
    "Policy",
    "PolicyList",
    "PolicyQuery",
    "PolicyRef",
    "ServiceAsk",
    "ServiceSpan",
    "ServiceVerdict",
]

Entity = Literal["email", "phone", "card", "iban", "ip", "secret"]
ENTITIES: tuple[Entity, ...] = get_args(Entity)
"""What the personal-data check finds: e-mail addresses, phone numbers (libphonenumber), card
numbers (Luhn), IBANs (their check digits), IP addresses, API keys and tokens of common shapes."""
Action = Literal["block", "redact", "record"]
"""block: the request is refused (an OpenAI-shaped error naming the policy and the category, never
the text); redact: replaced by a placeholder the model sees, the value put back in the answer;
record: counted only."""


class Check(Struct, kw_only=True):
    """One check of a policy."""

    kind: Literal["pii", "pattern", "service", "judge"]
    action: Action = "redact"
    """What a finding does (a service's verdict to block always blocks)."""
    entities: list[Entity] = field(default_factory=lambda: list(ENTITIES))
    """pii: which it looks for."""
    pattern: Annotated[str, Meta(max_length=1000)] = ""
    """pattern: an RE2 expression (linear time: no pattern can hang a request)."""
    label: Annotated[str, Meta(pattern=r"^([A-Z][A-Z0-9_]{0,30})?$")] = ""
    """pattern: its category, as errors and placeholders name it (`<LABEL_1>`)."""
    url: Annotated[str, Meta(max_length=2048)] = ""
    """service: where the texts are posted (`ServiceAsk`; it answers `ServiceVerdict`)."""
    timeout_s: Annotated[float, Meta(gt=0, le=30)] = 2.0
    """service: how long it has to answer."""
    on_error: Literal["block", "pass"] = "block"
    """service, judge: what a request meets when it does not answer, answers 5xx or what does not
    parse, or (a judge) has no replica ready (fail closed: block; fail open: pass)."""
    judge: str = ""
    """judge: the model asked for a verdict (any catalog model; through the router's own routing)."""
    judge_format: Literal["qwen3guard", "llamaguard"] = "qwen3guard"
    """judge: the answer format it gives (a model that is no guard model is held to it by a grammar)."""


class ServiceAsk(Struct, kw_only=True):
    """What an outside guardrail service is posted (JSON)."""

    texts: list[str]
    direction: Literal["input", "output"]
    policy: str
    tenant: str


class ServiceSpan(Struct, kw_only=True):
    """A part of one of the texts a service says is `category` (to be redacted)."""

    text: int
    """Which of the texts (its index)."""
    start: int
    end: int
    category: Annotated[str, Meta(pattern=r"^[A-Z][A-Z0-9_]{0,30}$")]


class ServiceVerdict(Struct, kw_only=True):
    """What an outside guardrail service answers (JSON)."""

    verdict: Literal["allow", "block"]
    category: str = ""
    """Why it blocks (named in the error; never the text)."""
    spans: list[ServiceSpan] = field(default_factory=list)


class Policy(Struct, kw_only=True):
    """Checks on the input, on the output, or both, of the requests it applies to."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    applies_to: Literal["tenant", "project", "key", "model"] = "tenant"
    target: str = ""
    """The project, key id or model it is attached to ("" for the tenant itself)."""
    input: list[Check] = field(default_factory=list)
    output: list[Check] = field(default_factory=list)
    """Whole answers are checked; a streamed answer gets its redacted values put back only."""
    tools: bool = False
    """Also check the MCP tool calls of the keys it applies to: their arguments by the input
    checks, their results by the output checks (redacted values put back in the result)."""
    created: float = 0.0
    by: str = ""


class PolicyList(Struct, kw_only=True):
    """Policies, by tenant and name."""

    policies: list[Policy]


class PolicyQuery(Struct, kw_only=True):
    """The policies of one tenant ("": every tenant)."""

    tenant: str = ""


class PolicyRef(Struct, kw_only=True):
    """One policy."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    by: str = ""


GUARD_PUT = Endpoint(
    "router",
    "guard.put",
    Policy,
    Policy,
    "Make a guardrail policy or change it (its patterns checked first).",
    admin=AdminRoute("PUT", "/guard/{tenant}/{name}"),
)
GUARD_LIST = Endpoint(
    "router", "guard.list", PolicyQuery, PolicyList, "Guardrail policies.", admin=AdminRoute("GET", "/guard")
)
GUARD_REMOVE = Endpoint(
    "router",
    "guard.remove",
    PolicyRef,
    PolicyList,
    "Remove a guardrail policy.",
    admin=AdminRoute("DELETE", "/guard/{tenant}/{name}"),
)
ENDPOINTS = (GUARD_PUT, GUARD_LIST, GUARD_REMOVE)
"""The guardrail endpoints (the router answers them)."""
