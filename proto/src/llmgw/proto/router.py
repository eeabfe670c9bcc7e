"""The router's contract: keys, projects, usage, demand, and its endpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._json import decode_json
from llmgw.proto._page import Page
from llmgw.proto._types import Name, NonNegative, Positive

__all__ = [
    "ENDPOINTS",
    "EVENTS",
    "KEY_CREATE",
    "KEY_LIST",
    "KEY_REVOKE",
    "PROJECT_PUT",
    "REQUEST_LOG",
    "USAGE",
    "USAGE_MOST_LATE_S",
    "USAGE_SLOT_GRACE_S",
    "USAGE_SLOT_S",
    "USAGE_SUM",
    "Demand",
    "KeyCreate",
    "KeyCreated",
    "KeyList",
    "KeyRecord",
    "KeyRef",
    "Limits",
    "Project",
    "RequestLog",
    "RequestLogAsk",
    "UsageQuery",
    "UsageRecord",
    "UsageRecords",
    "UsageReport",
    "UsageRolled",
    "UsageRow",
    "UsageSlot",
    "usage_order",
    "usage_records",
]


class Limits(Struct, kw_only=True):
    """Limits of a key or a project; None: no limit. Enforced across every router."""

    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    """Prompt and completion tokens in a minute (checked before, counted after each request)."""
    concurrent: Positive | None = None
    """Requests in flight at once."""
    tokens_per_day: Positive | None = None
    """A budget: once spent, requests get 429 with `x-should-retry: false` until the next UTC day."""
    tokens_per_month: Positive | None = None
    """A budget for the UTC calendar month."""


class Project(Struct, kw_only=True):
    """A project: keys belong to one; its limits hold for all its keys together."""

    name: Name
    limits: Limits = field(default_factory=Limits)
    created: float = 0.0
    by: str = ""
    """Who set its limits last."""


class KeyCreate(Struct, kw_only=True):
    """Make an API key."""

    name: Name
    """A label for the key (who or what uses it)."""
    admin: bool = False
    """Whether it may use the admin API (/api/v1/)."""
    project: Name = "default"
    """The project it belongs to (made if missing, with no limits)."""
    tenant: Name = "default"
    """The tenant it belongs to (its project is that tenant's)."""
    owner: str = ""
    """The user it belongs to ("": a service account of its tenant)."""
    expires_in_s: Positive | None = None
    """Seconds until it stops working; None: never."""
    models: list[Name] = field(default_factory=list)
    """Models (or aliases) it may use; empty: all."""
    limits: Limits = field(default_factory=Limits)
    by: str = ""
    """Who makes it (the audit trail says)."""


class KeyCreated(Struct, kw_only=True):
    """A new API key: shown once, stored only as its hash."""

    name: str
    key: str
    id: str = ""
    """The first 16 hex digits of its hash: how the admin API names it."""


class KeyRecord(Struct, kw_only=True):
    """What the keys bucket keeps of a key (under its sha256)."""

    name: str
    created: float
    admin: bool = False
    """Admin keys may use /api/v1/."""
    project: str = "default"
    tenant: str = "default"
    """The tenant it belongs to (keys made before tenants: the default one)."""
    owner: str = ""
    """The user it belongs to, who sees it and whose removal ends it; "": a service account's."""
    expires: float | None = None
    """Unix time it stops working."""
    models: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)


class KeyList(Struct, kw_only=True):
    """Every key (never the key itself: its id and what it may do), or a page of them, oldest first."""

    keys: dict[str, KeyRecord]
    """Key id -> record."""
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


class KeyRef(Struct, kw_only=True):
    """One key by its id (the first 16 hex digits of its hash)."""

    id: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}$")]
    by: str = ""
    """On revoke: who revokes it (the audit trail says)."""


class UsageRecord(Struct, kw_only=True):
    """One request as the router saw it: published to the usage stream after it ended."""

    request_id: str
    time: float
    key: str
    """The key's id."""
    project: str
    tenant: str = "default"
    model: str
    replica: str = ""
    status: int = 200
    prompt_tokens: NonNegative = 0
    cached_tokens: NonNegative = 0
    """Prompt tokens the engine served from its cache."""
    completion_tokens: NonNegative = 0
    saved_tokens: NonNegative = 0
    """Tokens an answer from the answer cache saved (its original's; `replica` is answer-cache)."""
    latency_s: float = 0.0
    ttft_s: float | None = None
    """Time to the first token, for streams."""


class RequestLogAsk(Struct, kw_only=True):
    """The latest requests, newest first, as the usage stream keeps them (never a prompt or an
    answer: who asked, which model and replica, tokens, times, status)."""

    limit: Annotated[int, Meta(ge=1, le=500)] = 100
    """How many (a page holds whole usage messages: a few more where the last one had more)."""
    model: str = ""
    """Only this model's ("": every model)."""
    key: Annotated[str, Meta(pattern=r"^([0-9a-f]{16})?$")] = ""
    """Only this key's, by its id ("": every key)."""
    errors: bool = False
    """Only those that did not end with a 200."""
    tenants: list[str] = field(default_factory=list)
    """Only these tenants' (empty: every tenant's): what the asker may see."""
    keys: list[str] = field(default_factory=list)
    """Only these keys' (empty: every key's): what the asker may see."""
    before: NonNegative = 0
    """The page older than this stream sequence (a page's `next`); 0: the latest."""


class RequestLog(Struct, kw_only=True):
    """A page of the request log, newest first."""

    requests: list[UsageRecord]
    next: NonNegative = 0
    """Ask again with this as `before` for older ones (also where a filtered page stopped at the
    most messages one page reads, short of `limit`); 0: there are none older."""


class UsageQuery(Page, kw_only=True):
    """Sum usage since a time, grouped by one field; over NATS, in pages of rows (`after`,
    `limit`: by bucket start, then group) where there are too many for one message."""

    since: Annotated[float, Meta(ge=0, le=253_402_300_799.0)] = 0.0
    """A Unix time in seconds, up to the last second of the year 9999."""
    group_by: Literal["model", "project", "key", "replica", "tenant"] = "model"
    bucket_s: NonNegative = 0
    """Sum each group in time buckets this many seconds long (a row per group and bucket, from a
    multiple of `bucket_s` since 1970); 0: one row per group over the whole span."""


class UsageRow(Struct, kw_only=True):
    """The sums of one group."""

    group: str
    start: float = 0.0
    """Where its time bucket starts (Unix time), with `UsageQuery.bucket_s`; else 0."""
    requests: NonNegative = 0
    errors: NonNegative = 0
    prompt_tokens: NonNegative = 0
    cached_tokens: NonNegative = 0
    completion_tokens: NonNegative = 0


class UsageReport(Struct, kw_only=True):
    """Usage sums, one row per group (`usage_order`; a page of them: by bucket start, then group)."""

    rows: list[UsageRow]
    next: str = ""
    """Where the next page of rows starts (ask again with it as `after`); "": this is the last."""


def usage_order(rows: list[UsageRow]) -> list[UsageRow]:
    """Rows as a report lists them: oldest bucket first, within one the most tokens first."""
    return sorted(rows, key=lambda row: (row.start, -(row.prompt_tokens + row.completion_tokens), row.group))


USAGE_SLOT_S = 300
"""The usage stream is summed as it arrives in slots this many seconds long (from a multiple of it
since 1970): a report reads a day as 288 slots' sums and only the stream's last minutes."""
USAGE_SLOT_GRACE_S = 60.0
"""A slot is closed (its sums written once) at the first message holding a request that ended this
long after the slot; a request of it that comes later is added to its sums then. Also the most a
request's `time` may be ahead of the stream's clock: a request is counted at the earlier of its
`time` and this long after the stream kept it (a router's clock far ahead moves nothing else)."""
USAGE_MOST_LATE_S = 7 * 86400.0
"""The most a request's `time` may be behind the stream's clock: one the stream kept later than
this after it ended (held by a router through a week's outage) counts this long before it was
kept, so a report looks for slots no further back than this before the first message it reads."""

UsageSums = Annotated[list[NonNegative], Meta(min_length=5, max_length=5, title="UsageSums")]
"""requests, errors, prompt_tokens, cached_tokens, completion_tokens."""


class UsageSlot(Struct, kw_only=True):
    """One slot's usage sums by one group (or one part of them, where they are too big for one
    entry), as the usage-slots bucket keeps them under `<start>.<group>.<part>`: every request of
    this slot and part (`usage_part`) in the usage stream's messages from `first` to `upto`. Every
    router writes the same entries from the same stream; a report adds the stream's requests after
    `upto`."""

    start: int
    """Unix time the slot starts (a multiple of `USAGE_SLOT_S`)."""
    group: Literal["model", "project", "key", "replica", "tenant"]
    """What these sums are by."""
    first: int
    """Stream sequence of the first message holding a request of this slot."""
    upto: int
    """Every request of this slot and part in messages up to this sequence is summed here."""
    part: NonNegative = 0
    parts: Positive = 1
    """How many entries the slot's sums by this group are split over (each value in one: `usage_part`)."""
    sums: dict[str, UsageSums] = field(default_factory=dict)
    """The group's value (a model's name, a key's id...) -> its sums."""


class UsageRolled(Struct, kw_only=True):
    """How far the routers have summed the usage stream into slots (key `rolled`)."""

    resume: int
    """Every request in messages before this sequence is in a slot's sums (a report reads the
    stream from here on, and a router summing starts here)."""
    horizon: float = 0.0
    """The latest request end seen before `resume`: which slots were closed there."""


class Demand(Struct, kw_only=True):
    """When a model was last asked for: written by the router (at once when it has no ready
    replica: a wake-up; else at most every few seconds), read by the scheduler."""

    model: Name
    last_asked: float
    """Unix time of the latest request."""


_MEMBERS = "member"
"""Keys, usage and the request log: a member calls them for its own."""
KEY_CREATE = Endpoint(
    "router",
    "key.create",
    KeyCreate,
    KeyCreated,
    "Make an API key (shown once).",
    admin=AdminRoute("POST", "/keys", 201, least=_MEMBERS),
)
KEY_LIST = Endpoint(
    "router",
    "key.list",
    Page,
    KeyList,
    "Every key by id (never the key), in pages.",
    admin=AdminRoute("GET", "/keys", least=_MEMBERS),
)
KEY_REVOKE = Endpoint(
    "router",
    "key.revoke",
    KeyRef,
    KeyList,
    "Revoke a key on every router.",
    admin=AdminRoute("DELETE", "/keys/{id}", least=_MEMBERS),
)
PROJECT_PUT = Endpoint(
    "router",
    "project.put",
    Project,
    Project,
    "Create a project or change its limits.",
    admin=AdminRoute("PUT", "/projects/{name}"),
)
USAGE_SUM = Endpoint(
    "router",
    "usage.sum",
    UsageQuery,
    UsageReport,
    "Requests and tokens since a time, summed.",
    timeout_s=60.0,  # a day's slots and the stream after them, each page
    admin=AdminRoute("GET", "/usage", least=_MEMBERS),
)
REQUEST_LOG = Endpoint(
    "router",
    "request.log",
    RequestLogAsk,
    RequestLog,
    "The latest requests, newest first (who, model, replica, tokens, times, status; never a prompt).",
    timeout_s=30.0,
    admin=AdminRoute("GET", "/requests", least=_MEMBERS),
)
ENDPOINTS = (KEY_CREATE, KEY_LIST, KEY_REVOKE, PROJECT_PUT, USAGE_SUM, REQUEST_LOG)
"""The router's endpoints."""

UsageRecords = Annotated[list[UsageRecord], Meta(title="list[UsageRecord]")]
"""What a usage message carries: the requests of one project and model that ended together on one
router (one publish, and one acknowledgement from the stream, for many requests). Routers before
this published one `UsageRecord` a message: `usage_records` reads both."""


def usage_records(data: bytes) -> list[UsageRecord]:
    """The records of one usage message, as routers publish it now (a list) or did (one record).
    A msgspec.DecodeError (ValidationError, JsonTooDeep) says what is wrong with one that is
    neither."""
    got = decode_json(data, type=UsageRecords | UsageRecord)
    return got if isinstance(got, list) else [got]


USAGE = Event(
    "usage",
    UsageRecords,
    "The requests of one project and model that ended together (the usage stream keeps these).",
    ("project", "model"),
    "router",
)
EVENTS = (USAGE,)
"""What routers publish."""
