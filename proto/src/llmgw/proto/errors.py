"""The error tree of every reply: each error carries the nats.micro code it travels as (400, 404,
409, 429, 500). Pure: a core raises these, its shell sends them."""

from __future__ import annotations

__all__ = ["BadRequest", "BusError", "Conflict", "Internal", "NotFound", "TooMany", "described", "from_code"]


class BusError(Exception):
    """An error a person can act on, sent as `Nats-Service-Error(-Code)` headers."""

    code = "500"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(BusError):
    """The request was malformed or asked for something impossible (400)."""

    code = "400"


class NotFound(BusError):
    """The thing named does not exist (404)."""

    code = "404"


class Conflict(BusError):
    """Someone else changed it first, or it already exists (409)."""

    code = "409"


class TooMany(BusError):
    """Asked too often: a limit somebody else keeps (the Hub's); the message says when to try again (429)."""

    code = "429"


class Internal(BusError):
    """The service failed; the message says how (500)."""

    code = "500"


_BY_CODE = {cls.code: cls for cls in (BadRequest, NotFound, Conflict, TooMany, Internal)}


def from_code(code: str, message: str) -> BusError:
    """The error for a reply's code (unknown codes are Internal)."""
    return _BY_CODE.get(code, Internal)(message)


def described(exc: BaseException) -> str:
    """An exception as a log line tells it: its type and its message. Never its repr: aiohttp's
    carries the request it failed on, headers and all, the engine's key among them."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
