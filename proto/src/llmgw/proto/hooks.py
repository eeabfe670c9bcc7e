"""Notifications: webhooks a tenant keeps for the events it chooses (a replica failed, a model
backing off or parked, a node lost, a mirror fetch failed), each body signed with the hook's own
secret (HMAC-SHA256), tried again with back-off, and kept as a dead letter when it never got
through. The router keeps them (its `hooks` bucket) and answers these endpoints; `llmgw ctl
hook`, the admin API and the console ask them."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._types import Name, NonNegative
from llmgw.proto.people import DEFAULT_TENANT

__all__ = [
    "EVENT_KINDS",
    "HOOK_DEAD",
    "HOOK_LIST",
    "HOOK_PUT",
    "HOOK_REMOVE",
    "HOOK_TEST",
    "DeadLetter",
    "DeadLetters",
    "EventKind",
    "Hook",
    "HookList",
    "HookQuery",
    "HookRef",
    "HookShown",
    "HookTried",
    "Notice",
]

EventKind = Literal[
    "replica.failed",
    "model.backing-off",
    "model.parked",
    "node.lost",
    "mirror.fetch-failed",
    "budget.80",
    "budget.spent",
    "upgrade.progress",
]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
"""What a hook may be sent: a model's events go to the tenants that may use the model; a budget's
(a key's or a tenant's day or month of tokens 80% used, or spent) to its tenant's hooks; the
fleet's (a node lost, a mirror fetch failed) to the default tenant's hooks (its operators')."""


class Hook(Struct, kw_only=True):
    """A webhook: where a tenant's chosen events are posted."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    url: Annotated[str, Meta(max_length=2048)]
    """http:// or https://, never one of the fleet's own admin ports."""
    events: list[EventKind] = field(default_factory=lambda: list(EVENT_KINDS))
    secret: Annotated[str, Meta(max_length=256)] = ""
    """What bodies are signed with (`X-Llmgw-Signature: sha256=HMAC(secret, "<timestamp>.<body>")`);
    "" on a put: one is made and shown once. Kept sealed, never shown back."""
    created: float = 0.0
    by: str = ""


class HookShown(Struct, kw_only=True):
    """A hook as it is shown (its secret never), and the secret made for it (shown this once)."""

    hook: Hook
    secret: str = ""


class HookList(Struct, kw_only=True):
    """Hooks, by tenant and name (secrets left empty)."""

    hooks: list[Hook]


class HookQuery(Struct, kw_only=True):
    """The hooks of one tenant ("": every tenant)."""

    tenant: str = ""


class HookRef(Struct, kw_only=True):
    """One hook."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    by: str = ""


class Notice(Struct, kw_only=True):
    """What a hook is sent (the JSON body): what happened, to what, when, in words."""

    kind: EventKind | Literal["test"]
    subject: str
    """The replica, model, node or repo it is about."""
    text: str
    time: float
    model: str = ""
    node: str = ""
    tenant: str = ""
    """A budget's tenant (its hooks alone are told)."""
    period: str = ""
    """The day or month a budget notice is of (it is sent once in it)."""


class HookTried(Struct, kw_only=True):
    """How a hook answered a test notice: its status (0: no answer) and what it said."""

    status: NonNegative
    said: str
    ms: NonNegative


class DeadLetter(Struct, kw_only=True):
    """A notice that never got through: to which hook, how often it was tried, the last answer."""

    hook: Name
    tenant: Name
    notice: Notice
    tries: NonNegative
    last: str
    time: float


class DeadLetters(Struct, kw_only=True):
    """The latest dead letters, newest first."""

    letters: list[DeadLetter]


HOOK_PUT = Endpoint(
    "router",
    "hook.put",
    Hook,
    HookShown,
    "Make a webhook or change it (a secret made where none is given, shown once).",
    admin=AdminRoute("PUT", "/hooks/{tenant}/{name}"),
)
HOOK_LIST = Endpoint("router", "hook.list", HookQuery, HookList, "Webhooks.", admin=AdminRoute("GET", "/hooks"))
HOOK_REMOVE = Endpoint(
    "router",
    "hook.remove",
    HookRef,
    HookList,
    "Remove a webhook.",
    admin=AdminRoute("DELETE", "/hooks/{tenant}/{name}"),
)
HOOK_TEST = Endpoint(
    "router",
    "hook.test",
    HookRef,
    HookTried,
    "Send a hook a test notice: how it answered.",
    timeout_s=30.0,
    admin=AdminRoute("POST", "/hooks/{tenant}/{name}/test"),
)
HOOK_DEAD = Endpoint(
    "router",
    "hook.dead",
    HookQuery,
    DeadLetters,
    "Notices that never got through.",
    admin=AdminRoute("GET", "/hooks/dead"),
)
ENDPOINTS = (HOOK_PUT, HOOK_LIST, HOOK_REMOVE, HOOK_TEST, HOOK_DEAD)
"""The webhook endpoints (the router answers them)."""
