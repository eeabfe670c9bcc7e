"""The serve form: a file held on the mirror put into service as a model, with every way it runs
on the fleet now (the catalog's serve plan: memory, where it fits, about how many tokens a second,
slow marks) to choose from.

The page never reckons a way itself: it draws the plan the catalog answers for the cores, context
and slots in the form, asked again as they change (`/console/serve/plan`, the same template part;
with JavaScript off, the Recompute button). The catalog keeps the rule that makes the CPU a choice
made on purpose; the page shows the "run on the CPU anyway" box where the plan's ways say that
rule applies, and the catalog's refusal in the form where it was not ticked.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import msgspec
from litestar import Request, get, post
from litestar.response import Redirect, Response

from llmgw.proto import Empty, catalog, mirror
from llmgw.proto.bounds import MOST_CONTEXT, MOST_CORES
from llmgw.proto.catalog import ServeModel, ServePlan, ServePlanAsk, ServeWay
from llmgw.router.console.mirror_pages import source_of
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES", "way_key"]

_FIELDS = ("source", "name", "context", "cores", "slots", "way", "cpu_anyway", "judge")
"""The form's fields (a GET's query, a POST's body)."""
MOST_SLOTS = 256
_CARD_WAY = re.compile(r"^gpus-([0-9]{1,3})$")


def way_key(way: ServeWay) -> str:
    """What the form's radio sends for `way`: 'cpu' for the CPU (one node or across nodes), else
    'gpus-N' for N cards a replica (what ServeModel's `cpu` and `gpus` say)."""
    return f"gpus-{way.cards}" if way.cards else "cpu"


def _chosen(plan: ServePlan, key: str) -> ServeWay | None:
    """The way the form chose (the plan's best when it chose none, or one the plan no longer has)."""
    return next((w for w in plan.ways if way_key(w) == key), plan.ways[0] if plan.ways else None)


def _query_form(view: View, request: Request) -> None:
    """A GET's query as the form the checks read (as a POST's body is)."""
    view.form = {f: request.query_params.get(f, "") for f in _FIELDS if f in request.query_params}


def _plan_ask(view: View) -> ServePlanAsk:
    """The form's file, context, cores and slots as the catalog's ServePlanAsk; Refused (400) saying
    which field is not right and what it takes."""
    fields = {
        "source": view.form.get("source", "").strip(),
        "context": view.number("context", 0, MOST_CONTEXT, 0, label=view.t("serve.context")),
        "cores": view.number("cores", 0, MOST_CORES, 0, label=view.t("serve.cores")),
        "slots": view.number("slots", 1, MOST_SLOTS, 2, label=view.t("serve.slots")),
        "judge": bool(view.form.get("judge")),
    }
    if not fields["source"]:
        raise Refused(400, view.t("serve.err.no_source"))
    try:
        return msgspec.convert(fields, ServePlanAsk)
    except msgspec.ValidationError:
        raise Refused(400, view.t("serve.err.source", source=fields["source"])) from None


async def _plan(view: View) -> tuple[ServePlan | None, str, int]:
    """The catalog's plan for the form's values, or why there is none (and its status)."""
    try:
        return await view.ask(catalog.SERVE_PLAN, _plan_ask(view)), "", 200
    except Refused as exc:
        return None, exc.message, exc.status


def _context(view: View, plan: ServePlan | None, error: str) -> dict:
    """What serve.html and its plan part draw: the form's values, the plan, the way chosen."""
    chosen = _chosen(plan, view.form.get("way", "")) if plan else None
    return {
        "form": view.form,
        "plan": plan,
        "error": error,
        "chosen": chosen,
        "way_key": way_key,
        "most_context": MOST_CONTEXT,
        "most_cores": MOST_CORES,
        "most_slots": MOST_SLOTS,
        "active": "serve",
    }


async def _form(view: View, status: int = 200, error: str = "") -> Response:
    """The serve form for the values in `view.form`, with the plan for them; `error` is why the
    last serve was refused (the plan's own refusal when it has none)."""
    plan, plan_error, plan_status = await _plan(view)
    if not error and plan_error:
        error, status = plan_error, plan_status
    return view.render("serve.html", status=status, **_context(view, plan, error))


@get("/serve")
async def serve_form(view: View, request: Request) -> Response:
    """The serve form for `?source=` (and the context, cores, slots and way in the query)."""
    _query_form(view, request)
    if not view.form.get("source"):
        return await _choose(view)
    return await _form(view)


async def _choose(view: View) -> Response:
    """The serve form reached from the navigation, no file named yet: every GGUF file the mirror
    holds verified, each with its way to the form."""
    repos = (await view.ask(mirror.REPO_LIST, Empty())).repos
    files = [
        (source_of(r, f.path), f.size)
        for r in repos
        for f in r.files
        if f.state == "ready" and f.path.endswith(".gguf")
    ]
    return view.render("serve_choose.html", active="serve", files=files)


@get("/serve/plan")
async def serve_plan_part(view: View, request: Request) -> Response:
    """The plan part of the form alone, for the query's values: what the form's script swaps in as
    the cores, context or slots change (the status is the catalog's where it refused)."""
    _query_form(view, request)
    plan, error, status = await _plan(view)
    return view.render("serve_plan.html", status=status, **_context(view, plan, error))


def _serve_message(view: View) -> ServeModel:
    """The posted form as the catalog's ServeModel: the way chosen as `cpu` or `gpus`; Refused
    (400) for a field that is not right."""
    ask = _plan_ask(view)
    way = view.form.get("way", "")
    card = _CARD_WAY.match(way)
    if way not in ("", "cpu") and not card:
        raise Refused(400, view.t("serve.err.way", way=way))
    name = view.form.get("name", "").strip()
    fields = {
        "source": ask.source,
        "name": name,
        "cpu": way == "cpu",
        "gpus": int(card[1]) if card else 0,
        "cores": ask.cores,
        "context": ask.context,
        "slots": ask.slots,
        "cpu_anyway": bool(view.form.get("cpu_anyway")),
        "judge": ask.judge,
        "by": view.by,
    }
    try:
        return msgspec.convert(fields, ServeModel)
    except msgspec.ValidationError:
        raise Refused(400, view.t("serve.err.name", name=name)) from None


@post("/serve")
async def serve(view: View) -> Response:
    """Serve the file the way chosen (Recompute: the form again for the values given)."""
    if view.form.get("recompute"):
        values = {f: view.form[f] for f in _FIELDS if view.form.get(f)}
        return Redirect(f"{PREFIX}/serve?{urlencode(values)}", status_code=303)
    try:
        entry = await view.ask(catalog.SERVE, _serve_message(view))
    except Refused as exc:
        return await _form(view, exc.status, exc.message)
    name = entry.model.name
    said = view.t("serve.done", name=name)
    if entry.warnings:
        said += " " + view.t("serve.done_warned", warnings=" ".join(entry.warnings))
    return view.done(f"{PREFIX}/models/{quote(name)}", said)


ROUTES = (serve_form, serve_plan_part, serve)
