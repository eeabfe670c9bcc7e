"""The HTTP app (Litestar): OpenAI's routes under /v1 and the admin API under /api/v1; every
error leaves in OpenAI's error body, translated here at the boundary."""

from __future__ import annotations

import uuid

from litestar import Litestar, Request, Router, get, post
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.response import Response

from llmgw.bus import get_logger
from llmgw.router.config import RouterConfig
from llmgw.router.errors import ApiError, Internal, InvalidBody, http_error
from llmgw.router.gateway import Gateway
from llmgw.router.metrics import Metrics

__all__ = ["http_app"]

_REJECTED = (400, 413, 429)
"""Statuses counted as refusals before any engine (by their code)."""


def http_app(
    gateway: Gateway, admin: Router, console: Router, metrics: Metrics, config: RouterConfig, version: str
) -> Litestar:
    """The router's HTTP app: the OpenAI routes answered by `gateway`, the admin API `admin`, the web
    console `console` (its own error pages);
    refusals counted in `metrics`; bodies up to `config.max_body_bytes`; `version` in its schema."""
    log = get_logger("router")

    @get("/v1/models")
    async def list_models(request: Request) -> dict:
        """The models (and aliases) this key may use."""
        return gateway.models(request.headers.get("authorization", ""))

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request) -> Response:
        """OpenAI's chat completions, streamed or not."""
        return await gateway.handle(request, "/v1/chat/completions")

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Response:
        """OpenAI's (legacy) completions, streamed or not."""
        return await gateway.handle(request, "/v1/completions")

    @post("/v1/embeddings", status_code=200)
    async def embeddings(request: Request) -> Response:
        """OpenAI's embeddings (the replica's engine must serve them)."""
        return await gateway.handle(request, "/v1/embeddings")

    def on_api_error(request: Request, exc: ApiError) -> Response:
        if exc.status in _REJECTED:
            metrics.rejected(exc.code or str(exc.status))
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
            rid = scope.setdefault("state", {}).setdefault("request_id", uuid.uuid4().hex)
            message.setdefault("headers", []).append((b"x-request-id", rid.encode()))

    return Litestar(
        [list_models, chat, completions, embeddings, admin, console],
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
