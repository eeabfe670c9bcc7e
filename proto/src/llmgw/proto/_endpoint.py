"""An endpoint of a service: its subject, the request it takes and the reply it gives.

Each service's proto module declares its endpoints in one table (`ENDPOINTS`); the bus
serves them as nats.micro groups and callers get the reply type from them, so a subject,
its request, its reply, how long a caller waits and (for an operator's operation) its admin API
route are written once: `ctl`, the admin API and the consoles all ask through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

import msgspec

__all__ = ["PREFIX", "VERSION", "AdminRoute", "Endpoint", "Event", "type_name"]

VERSION = "v1"
PREFIX = f"llmgw.{VERSION}"

Req = TypeVar("Req")
Rep = TypeVar("Rep")


def type_name(tp: object) -> str:
    """What a message type is called: its class name, or the title a union was given
    (`Annotated[A | B, msgspec.Meta(title=...)]`)."""
    if isinstance(tp, type):
        return tp.__name__
    titles = [m.title for m in getattr(tp, "__metadata__", ()) if isinstance(m, msgspec.Meta) and m.title]
    return titles[0] if titles else " | ".join(type_name(a) for a in get_args(tp)) or repr(tp)


@dataclass(frozen=True)
class AdminRoute:
    """Where the router's admin API (`/api/v1`, admin keys only) serves an operator's endpoint.

    The request is made of the path's parameters (each into the field of its name, or as
    `fields` says), then the query string (GET, DELETE) or the JSON body (POST, PUT); a request
    with a `by` field gets the asking key's name there.
    """

    method: str
    """GET, POST, PUT or DELETE."""
    path: str
    """Under /api/v1, with `{name}` parameters: `/mirror/{owner}/{name}`."""
    status: int = 200
    """The status of a success (202: accepted and under way)."""
    fields: tuple[tuple[str, str], ...] = ()
    """Request fields made of path parameters: `(("repo", "{owner}/{name}"),)`."""
    body: bool = True
    """POST, PUT: the request's other fields come from a JSON body (False: the query string)."""
    least: Literal["member", "operator", "admin"] = "admin"
    """The least role a key's principal needs to call it: a member (a key a user owns, for its own
    keys, usage and requests), an operator (the models its tenants may use, the mirror, the fleet)
    or an admin. What a member or an operator sees is narrowed by the router's one rule."""


@dataclass(frozen=True)
class Endpoint(Generic[Req, Rep]):
    """A request subject `llmgw.v1.<service>[.<node>].<name>` and its message types."""

    service: str
    """The service that answers ('catalog')."""
    name: str
    """The verb, dotted ('model.put')."""
    request: type[Req]
    reply: type[Rep]
    doc: str
    """What it does, one sentence (docs/subjects.md shows it)."""
    per_node: bool = False
    """Each node's agent answers on its own subject (`llmgw.v1.agent.<node>.<name>`)."""
    every_instance: bool = False
    """Every instance answers (each in its own queue group): callers gather the replies."""
    speaks_for: str = ""
    """The request's field that names the asking node (`node`): the subject ends with that node
    (`llmgw.v1.scheduler.node.register.<node>`), the server lets each agent ask only on its own,
    and the service refuses a request whose field names another node than its subject."""
    signed_by: str = ""
    """The role whose key signs every request (`scheduler`): the service acts only on requests it
    signed, for this subject and lately (llmgw.bus.Signer, Verifier)."""
    timeout_s: float = 10.0
    """How long a caller waits for the reply (each page of a list)."""
    admin: AdminRoute | None = None
    """Its route on the router's admin API, for an operator's operation (None: not there)."""

    def group(self, node: str = "") -> str:
        """The nats.micro group (subject prefix) this endpoint is served under."""
        if self.per_node:
            if not node:
                raise ValueError(f"{self.service}.{self.name} is per node: name the node")
            return f"{PREFIX}.{self.service}.{node}"
        return f"{PREFIX}.{self.service}"

    def subject(self, node: str = "") -> str:
        """The subject a request is sent on (`node` for per-node endpoints, and for those that
        speak for a node: the asking one)."""
        if self.speaks_for:
            if not node:
                raise ValueError(f"{self.service}.{self.name} speaks for a node: name the asking node")
            return f"{self.group()}.{self.name}.{node}"
        return f"{self.group(node)}.{self.name}"

    @property
    def pattern(self) -> str:
        """The subject for every node (`*` in the node's place): what a permission to ask it names."""
        return self.subject("*") if self.per_node or self.speaks_for else self.subject()

    def asker(self, subject: str) -> str:
        """The node a subject of this endpoint speaks for ('' where it names none)."""
        return subject.rsplit(".", 1)[-1] if self.speaks_for else ""

    @property
    def micro_name(self) -> str:
        """The endpoint's name in nats.micro (`$SRV.INFO` lists it): the verb with dashes."""
        return self.name.replace(".", "-")


@dataclass(frozen=True)
class Event(Generic[Req]):
    """An event subject `llmgw.v1.evt.<what>.<id...>` and the message published on it."""

    what: str
    """'node.heartbeat', 'replica', 'model', 'usage'."""
    message: type[Req] | None
    """None: the payload is the subject alone (a wake-up)."""
    doc: str
    ids: tuple[str, ...] = ("id",)
    """The tokens after `what` ('node', or 'project', 'model')."""
    publisher: str = ""
    """Who publishes it."""

    def subject(self, *ids: str) -> str:
        """The subject for one id (or ids)."""
        if len(ids) != len(self.ids):
            raise ValueError(f"evt.{self.what} takes {', '.join(self.ids)}")
        return ".".join((f"{PREFIX}.evt.{self.what}", *ids))

    def parse(self, subject: str) -> tuple[str, ...] | None:
        """The ids a subject of this event names (None: not one of this event's subjects)."""
        head = f"{PREFIX}.evt.{self.what}."
        if not subject.startswith(head):
            return None
        ids = tuple(subject[len(head) :].split("."))
        return ids if len(ids) == len(self.ids) and all(ids) else None

    @property
    def all(self) -> str:
        """The wildcard subject every instance of this event matches."""
        tail = ".>" if len(self.ids) > 1 else ".*"
        return f"{PREFIX}.evt.{self.what}{tail}"
