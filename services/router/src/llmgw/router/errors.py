"""The router's errors, one class per kind, each with its HTTP status and OpenAI `type` and
`code` as class attributes (Litestar's style); the HTTP app turns them into OpenAI's error body
at the boundary. Pure: no I/O.

    raise ModelNotFound("The model 'x' does not exist; GET /v1/models lists them.", param="model")
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from llmgw.proto.errors import described

__all__ = [
    "ApiError",
    "BadName",
    "BadRevision",
    "BodyTooLarge",
    "BudgetSpent",
    "ContextTooLong",
    "ExpiredKey",
    "Forbidden",
    "HttpError",
    "Internal",
    "InvalidBody",
    "InvalidChange",
    "InvalidJson",
    "InvalidKey",
    "InvalidRequest",
    "KeyNotFound",
    "MaxTokensTooLarge",
    "MissingField",
    "MissingKey",
    "MissingModel",
    "ModelNotAllowed",
    "ModelNotFound",
    "ModelStopped",
    "NameMismatch",
    "NestedTooDeep",
    "NoReadyReplica",
    "NotAdmin",
    "NotServed",
    "RateLimited",
    "ServiceRefused",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpstreamFailed",
    "answered_error",
    "described",
    "http_error",
    "refused",
]


class ApiError(Exception):
    """An answer in OpenAI's error body: {"error": {"message", "type", "param", "code"}}.

    Subclasses set `status`, `type` and `code`; an instance carries its message, the parameter
    at fault and headers to send with it.
    """

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(ApiError):
    """A value the request may not have."""

    status, type, code = 400, "invalid_request_error", "invalid_value"


class NotServed(InvalidRequest):
    """The model does not serve this endpoint (an embedding model asked to chat, or its engine answered 501)."""

    code = "unsupported_endpoint"


class MissingField(InvalidRequest):
    """A field the request needs is missing."""

    code = "missing_field"


class InvalidBody(InvalidRequest):
    """The body is not the object the route takes."""

    code = "invalid_body"


class InvalidJson(InvalidRequest):
    """The body is not JSON."""

    code = "invalid_json"


class NestedTooDeep(InvalidJson):
    """JSON nested deeper than the router reads."""

    code = "json_too_deep"


class MissingModel(InvalidRequest):
    """The body names no model."""

    code = "missing_model"


class MaxTokensTooLarge(InvalidRequest):
    """A longer answer than the model gives."""

    code = "max_tokens_too_large"


class ContextTooLong(InvalidRequest):
    """The prompt and the answer it asks for do not fit in the model's context."""

    code = "context_length_exceeded"


class NameMismatch(InvalidRequest):
    """The body names another thing than the path."""

    code = "name_mismatch"


class InvalidChange(InvalidRequest):
    """A model change the catalog's message cannot hold."""

    code = "invalid_change"


class BadRevision(InvalidRequest):
    """A revision no model can have."""

    code = "bad_revision"


class BadName(InvalidRequest):
    """Not a model name."""

    code = "bad_name"


class Unauthorized(ApiError):
    """The request's API key is missing or not good."""

    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class MissingKey(Unauthorized):
    """No API key sent."""

    code = "missing_api_key"


class InvalidKey(Unauthorized):
    """An API key no router knows."""

    code = "invalid_api_key"


class ExpiredKey(Unauthorized):
    """An API key past its expiry."""

    code = "expired_api_key"


class Forbidden(ApiError):
    """The key may not do this."""

    status, type, code = 403, "permission_error", "forbidden"


class NotAdmin(Forbidden):
    """A key without the admin right on the admin API."""

    code = "not_admin"


class ModelNotAllowed(Forbidden):
    """A model the key may not use."""

    code = "model_not_allowed"


class ModelNotFound(ApiError):
    """A model (or alias) the catalog does not have."""

    status, type, code = 404, "invalid_request_error", "model_not_found"


class KeyNotFound(ApiError):
    """A key id no key has."""

    status, type, code = 404, "not_found_error", "key_not_found"


class BodyTooLarge(ApiError):
    """A body beyond the router's limit."""

    status, type, code = 413, "invalid_request_error", "body_too_large"


class UnsupportedMediaType(ApiError):
    """A body sent as something other than JSON."""

    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class RateLimited(ApiError):
    """A limit of the key or its project refuses it now; retrying after the reset helps."""

    status, type, code = 429, "rate_limit_exceeded", "rate_limit_exceeded"


class BudgetSpent(RateLimited):
    """A day's or month's budget is spent: retrying before the reset cannot help."""

    type, code = "insufficient_quota", "budget_exhausted"


class Internal(ApiError):
    """The router failed on the request."""


class UpstreamFailed(ApiError):
    """The replica failed mid-answer."""

    status, code = 502, "upstream_failed"


class NoReadyReplica(ApiError):
    """Neither the model nor its fallbacks has a ready replica."""

    status, code = 503, "no_ready_replica"


class ModelStopped(ApiError):
    """The model was stopped by an operator (and has no fallback that answers): waiting will not help."""

    status, code = 503, "model_stopped"


class ServiceRefused(ApiError):
    """A service behind the router refused an operator's request, failed or did not answer:
    its words, with the status and `type` its bus code means (`refused`)."""

    def __init__(self, status: int, type_: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.code = status, type_, code


_BY_BUS_CODE = {
    "400": (400, "invalid_request_error"),
    "404": (404, "not_found_error"),
    "409": (409, "conflict_error"),
    "429": (429, "rate_limit_exceeded"),
}
"""A bus error's code -> the HTTP status and OpenAI `type` every face answers it with; any other
(a service that failed, or none that answered) is a 502."""


def answered_error(status: int, body: bytes) -> ServiceRefused:
    """An answer in OpenAI's error body as the error it says: what the router's own features
    (a judge, an embedding) get back from its routing."""
    try:
        error = json.loads(body)["error"]
        message, type_, code = str(error["message"]), str(error.get("type") or ""), str(error.get("code") or "")
    except (ValueError, KeyError, TypeError):
        return ServiceRefused(status, "server_error", str(status), f"it answered {status}")
    return ServiceRefused(status, type_, code or str(status), message)


def refused(service: str, code: str, message: str) -> ServiceRefused:
    """A service's error reply (its nats.micro `code`) as every face of the router answers it (the
    admin API, the web console): `<service>_<code>` in OpenAI's body (`catalog_404`)."""
    status, type_ = _BY_BUS_CODE.get(code, (502, "server_error"))
    return ServiceRefused(status, type_, f"{service}_{code}", message)


class HttpError(ApiError):
    """What Litestar itself refused (an unknown route, a wrong method), under its own status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, f"http_{status}"
        self.type = "invalid_request_error" if status < 500 else "server_error"


def http_error(status: int, message: str) -> ApiError:
    """Litestar's own HTTP error in OpenAI's body."""
    return BodyTooLarge(message) if status == 413 else HttpError(status, message)
