"""Outside providers: an OpenAI-compatible service (its base URL, several keys) that answers some
of the fleet's models, as a fallback while the model's own replicas are not ready or in their
place. Requests go to the key least used this minute that is not cooling down (a 429 or a 401
cools a key for as long as the provider says, else longer each time) and that has room within
its own limits. Keys are sealed under the fleet's secret where they are kept, never shown back.
The router keeps providers (the `providers` bucket) and answers these endpoints, an admin's
(`llmgw ctl provider`, the admin API)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._types import Empty, Name, NonNegative

__all__ = [
    "ENDPOINTS",
    "PROVIDER_LIST",
    "PROVIDER_PUT",
    "PROVIDER_REMOVE",
    "KeyState",
    "Provider",
    "ProviderKey",
    "ProviderList",
    "ProviderRef",
]


class ProviderKey(Struct, kw_only=True):
    """One of a provider's keys, and the limits the provider holds it to."""

    name: Name
    """What it is called here (`team-a`): the key itself is never shown."""
    key: Annotated[str, Meta(max_length=4000)] = ""
    """The secret (sealed where it is kept; listed as "(hidden)": sent back as it is, it is kept)."""
    requests_per_minute: NonNegative = 0
    """0: no limit known."""
    tokens_per_minute: NonNegative = 0
    """Prompt and answer tokens together (0: no limit known)."""


class Provider(Struct, kw_only=True):
    """An outside OpenAI-compatible service and the models it answers."""

    name: Name
    base_url: Annotated[str, Meta(max_length=2000)]
    """Where its OpenAI API is (`https://api.openai.com/v1`): requests go to `<base_url>/chat/completions`."""
    keys: Annotated[list[ProviderKey], Meta(min_length=1, max_length=100)]
    models: dict[Name, Annotated[str, Meta(min_length=1, max_length=200)]]
    """Our model name -> its name there (`{"gpt-mini": "gpt-4o-mini"}`). A name the catalog does
    not have is a model of the provider's alone."""
    use: Literal["fallback", "only"] = "fallback"
    """fallback: while the model has no ready replica of its own (back to them once it has);
    only: always the provider."""
    context: Annotated[int, Meta(ge=256)] = 8192
    """The context of its models the catalog does not have (prompts longer are refused here)."""
    timeout_s: Annotated[float, Meta(gt=0, le=600)] = 60.0
    """How long a stream's first byte may take. A whole (unstreamed) answer's first byte comes once
    it is written whole, so it has the router's `upstream_timeout_s` (600 s), as a replica's does."""
    created: float = 0.0
    by: str = ""


class KeyState(Struct, kw_only=True):
    """How a key is on the router that answered."""

    cooling_until: float = 0.0
    """It is not used before then (0: it is not cooling)."""
    why: str = ""
    """What cooled it (429, 401)."""
    requests: NonNegative = 0
    """Requests sent with it this minute."""
    tokens: NonNegative = 0
    """Tokens it spent this minute."""


class ProviderList(Struct, kw_only=True):
    """Providers (keys hidden) and how each key is."""

    providers: list[Provider]
    keys: dict[str, KeyState] = {}
    """`<provider>.<key name>` -> its state on the router that answered."""


class ProviderRef(Struct, kw_only=True):
    """One provider."""

    name: Name
    by: str = ""


PROVIDER_PUT = Endpoint(
    "router",
    "provider.put",
    Provider,
    Provider,
    "Add an outside provider or change it (its keys sealed; a key sent back as shown is kept where `base_url` "
    "is the same).",
    admin=AdminRoute("PUT", "/providers/{name}"),
)
PROVIDER_LIST = Endpoint(
    "router", "provider.list", Empty, ProviderList, "Outside providers.", admin=AdminRoute("GET", "/providers")
)
PROVIDER_REMOVE = Endpoint(
    "router",
    "provider.remove",
    ProviderRef,
    ProviderList,
    "Remove an outside provider.",
    admin=AdminRoute("DELETE", "/providers/{name}"),
)
ENDPOINTS = (PROVIDER_PUT, PROVIDER_LIST, PROVIDER_REMOVE)
