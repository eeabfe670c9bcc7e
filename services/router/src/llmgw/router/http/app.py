"""The HTTP app: OpenAI's routes under /v1 (`endpoint.OpenAIEndpoint`, no framework on the hot
path) in front of Litestar's app for the rest (the admin API under /api/v1, the console); every
error leaves in OpenAI's error body, translated here at the boundary."""

from __future__ import annotations

from litestar import Litestar, Request, Router
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, OpenAPIResponse, Operation, PathItem, RequestBody, Schema
from litestar.response import Response

from llmgw.bus import get_logger
from llmgw.router.config import RouterConfig
from llmgw.router.errors import ApiError, Internal, InvalidBody, http_error
from llmgw.router.http.endpoint import OPENAI_ROUTES, OpenAIEndpoint, request_id
from llmgw.router.metrics import Metrics
from llmgw.router.request.gateway import Gateway

__all__ = ["http_app"]


def http_app(
    gateway: Gateway, admin: list[Router], console: Router, metrics: Metrics, config: RouterConfig, version: str
) -> OpenAIEndpoint:
    """The router's HTTP app: the OpenAI routes answered by `gateway`, the admin routes `admin`, the web
    console `console` (its own error pages); refusals counted in `metrics`; bodies up to
    `config.max_body_bytes`; `version` in its schema."""
    log = get_logger("router")

    def on_api_error(request: Request, exc: ApiError) -> Response:
        return Response(exc.body(), status_code=exc.status, headers=exc.headers)

    def on_invalid(request: Request, exc: ValidationException) -> Response:
        extra = "; ".join(str(e.get("message", e)) for e in (exc.extra or []) if isinstance(e, dict))
        return on_api_error(request, InvalidBody(f"{exc.detail}{': ' + extra if extra else ''}"))

    def on_http(request: Request, exc: HTTPException) -> Response:
        return on_api_error(request, http_error(exc.status_code, str(exc.detail)))

    def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("request failed inside the router", path=request.url.path)
        message = f"The router failed on this request ({type(exc).__name__}); its log has the details."
        return on_api_error(request, Internal(message))

    async def add_request_id(message, scope) -> None:
        if message["type"] == "http.response.start":
            rid = scope.setdefault("state", {}).setdefault("request_id", request_id())
            message.setdefault("headers", []).append((b"x-request-id", rid.encode()))

    rest = Litestar(
        [*admin, console],
        exception_handlers={
            ApiError: on_api_error,
            ValidationException: on_invalid,
            HTTPException: on_http,
            Exception: on_bug,
        },
        before_send=[add_request_id],
        request_max_body_size=config.max_body_bytes,
        openapi_config=OpenAPIConfig(title="llmgw", version=version, path="/schema"),
    )
    _listed(rest.openapi_schema)
    return OpenAIEndpoint(gateway, metrics, config.max_body_bytes, rest)


def _listed(schema: OpenAPI) -> None:
    """The OpenAI routes added to the schema Litestar serves (it does not answer them)."""
    answers = {"200": OpenAPIResponse(description="OpenAI's answer (a stream where asked)")}
    for path, (method, summary) in OPENAI_ROUTES.items():
        operation = Operation(summary=summary, operation_id=path.replace("/", "_").strip("_"), responses=answers)
        if method == "POST":
            json_body = {"application/json": OpenAPIMediaType(schema=Schema(type="object"))}
            operation.request_body = RequestBody(content=json_body, required=True)
        schema.paths[path] = PathItem(**{method.lower(): operation})
