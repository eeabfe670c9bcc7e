"""How a request ended, as values: what the router knew of it when it was let in (`Ticket`),
what the replica made of it (`Served`), and the two together (`Outcome`), which metrics, limits
and the usage stream are told. Pure: no I/O, no clock.
"""

from __future__ import annotations

import msgspec

from llmgw.proto import UsageRecord
from llmgw.router.errors import InvalidRequest
from llmgw.router.request.core import Usage

__all__ = ["Outcome", "Served", "Ticket", "ended_by", "status_of"]


class Ticket(msgspec.Struct, frozen=True, kw_only=True):
    """A request whose model is known: who sent it, for what, since when."""

    request_id: str
    key_id: str
    project: str
    model: str
    """The model it asked for."""
    tenant: str = "default"
    started: float
    """`time.perf_counter()` when it arrived."""


class Served(msgspec.Struct, frozen=True, kw_only=True):
    """What became of a request: refused before any engine (no replica), or answered by one."""

    status: int
    model: str = ""
    """The model whose replica answered (a fallback's name where one did); "": the asked-for."""
    replica: str = ""
    pool: str = ""
    """The replica's pool ("priority 10")."""
    usage: Usage = Usage()
    first_token: float | None = None
    """`time.perf_counter()` when a stream's first token arrived."""
    saved: int = 0
    """Tokens an answer from the answer cache saved (its original's)."""
    admitted: bool = True
    """False: refused before admission, or for itself after it (nothing counted against its
    limits: what admitting it counted is given back)."""


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A request ended."""

    ticket: Ticket
    served: Served
    latency_s: float

    @property
    def model(self) -> str:
        """The model it is counted under: the one that answered."""
        return self.served.model or self.ticket.model

    @property
    def ttft_s(self) -> float | None:
        """Time to the first token, for streams."""
        first = self.served.first_token
        return None if first is None else first - self.ticket.started

    def usage_record(self, now: float) -> UsageRecord:
        """What the usage stream keeps of it."""
        usage = self.served.usage
        return UsageRecord(
            request_id=self.ticket.request_id,
            time=now,
            key=self.ticket.key_id,
            project=self.ticket.project,
            tenant=self.ticket.tenant,
            model=self.model,
            replica=self.served.replica,
            status=self.served.status,
            prompt_tokens=usage.prompt,
            cached_tokens=usage.cached or 0,
            completion_tokens=usage.completion,
            saved_tokens=self.served.saved,
            latency_s=self.latency_s,
            ttft_s=self.ttft_s,
        )


def status_of(exc: BaseException) -> int:
    """The status a request ends with when `exc` ended it: an API error's own; 499 where its task
    was cancelled (the client went away); else 500."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    return 500 if isinstance(exc, Exception) else 499


def ended_by(tried: Served, exc: BaseException) -> Served:
    """How a forwarded request ended when `exc` ended it (`tried`: the last replica tried): with
    the status `status_of` says. One refused for itself (a 400: its prompt, measured only once its
    model woke, does not fit) counts as never admitted, as it would have been before the wake."""
    return msgspec.structs.replace(tried, status=status_of(exc), admitted=not isinstance(exc, InvalidRequest))
