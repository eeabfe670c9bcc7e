"""The admin API's serve routes: the ways a mirrored file can run on the fleet now
(`GET /api/v1/serve/plan`), and putting it into service (`POST /api/v1/serve`); admin keys only,
as every /api/v1 route.

Each is a thin translation to the catalog's endpoint, which keeps the rule (the CPU as a choice
made on purpose) so no client can skip it; its errors keep their meaning (400, 404, 409).
"""

from __future__ import annotations

import msgspec
from litestar import Request, get, post
from nats.aio.client import Client

from llmgw.bus import BusError, call, get_logger
from llmgw.proto import ModelEntry, catalog
from llmgw.proto.catalog import ServeModel, ServePlan, ServePlanAsk
from llmgw.router.errors import BadQuery, catalog_error

__all__ = ["SERVE_ROUTES", "plan_serve", "serve_model"]

_log = get_logger("router")

_PLAN_S = 60.0
"""A plan reads the file's header from the mirror over HTTP and asks the scheduler for its nodes."""


async def _ask(nc: Client, request: Request, endpoint, message: msgspec.Struct):
    _log.info("admin call", subject=endpoint.subject(), key=request.state.key.name)
    try:
        return await call(nc, endpoint, message, timeout=_PLAN_S)
    except BusError as exc:
        raise catalog_error(exc.code, exc.message) from None


@get("/serve/plan")
async def plan_serve(
    request: Request, nc: Client, source: str, context: int = 0, cores: int = 0, slots: int = 2
) -> ServePlan:
    """Every way the mirrored `source` runs on the fleet now, best first: its memory, the nodes it
    fits now and how many more replicas, about how many tokens a second, slow marks."""
    try:
        ask = msgspec.convert({"source": source, "context": context, "cores": cores, "slots": slots}, ServePlanAsk)
    except msgspec.ValidationError as exc:
        raise BadQuery(f"serve plan query: {exc}") from None
    return await _ask(nc, request, catalog.SERVE_PLAN, ask)


@post("/serve", status_code=201)
async def serve_model(request: Request, nc: Client, data: ServeModel) -> ModelEntry:
    """Put a mirrored file into service: the way chosen (`cpu`, `gpus`, or the plan's best) becomes
    the model's profiles; a very slow CPU way, or the CPU while cards are free, needs `cpu_anyway`.
    The answer's `warnings` say what was taken knowingly. Who asks is the key's name."""
    served = msgspec.structs.replace(data, by=request.state.key.name)
    return await _ask(nc, request, catalog.SERVE, served)


SERVE_ROUTES = (plan_serve, serve_model)
"""The serve routes, for the admin Router."""
