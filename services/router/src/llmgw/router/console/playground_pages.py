"""The playground: a chat with any model the signed-in key may use, through the router's own
gateway (its routing, limits and usage, under that key, as any client's request). With
JavaScript off the form is answered whole, with its tokens and how long it took; with it on,
`playground.js` streams the answer (`/playground/stream`) and shows the time to the first
token and tokens a second as they come."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import get, post
from litestar.response import Response, Stream

from llmgw.router.console.web import Refused, View
from llmgw.router.errors import ApiError
from llmgw.router.http.endpoint import request_id
from llmgw.router.request.relay import Answer, Relay

__all__ = ["MOST_ANSWER", "MOST_TEXT", "ROUTES"]

MOST_TEXT = 32_000
"""Characters a message of the form may have."""
MOST_ANSWER = 4096
"""The longest answer the form asks for, tokens."""
_PATH = "/v1/chat/completions"
_HEADERS = {"content-type": "application/json"}


def _form(view: View) -> dict[str, Any]:
    return {
        "model": view.form.get("model", ""),
        "system": view.form.get("system", ""),
        "prompt": view.form.get("prompt", ""),
        "max_tokens": view.form.get("max_tokens", "256"),
        "temperature": view.form.get("temperature", "0.7"),
    }


def _body(view: View, stream: bool) -> bytes:
    """The chat request the form asks for; Refused (400) naming a field that is not right."""
    form = _form(view)
    if form["model"] not in view.console.gateway.model_names(view.key):
        raise Refused(400, view.t("play.err.model", model=form["model"]))
    if not form["prompt"].strip():
        raise Refused(400, view.t("play.err.prompt"))
    if len(form["prompt"]) > MOST_TEXT or len(form["system"]) > MOST_TEXT:
        raise Refused(400, view.t("play.err.long", most=view.num(MOST_TEXT)))
    longest = view.number("max_tokens", 1, MOST_ANSWER, 256, view.t("play.max_tokens"))
    try:
        temperature = float(form["temperature"] or "0.7")
    except ValueError:
        temperature = -1.0
    if not 0.0 <= temperature <= 2.0:
        raise Refused(400, view.t("play.err.temperature", got=form["temperature"]))
    messages = [{"role": "system", "content": form["system"]}] if form["system"].strip() else []
    messages.append({"role": "user", "content": form["prompt"]})
    body: dict[str, Any] = {"model": form["model"], "messages": messages, "max_tokens": longest}
    body |= {"temperature": temperature, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return msgspec.json.encode(body)


async def _ask(view: View, body: bytes) -> Answer | Relay:
    """The request through the gateway under the signed-in key."""
    assert view.principal is not None and view.key is not None

    async def read() -> bytes:
        return body

    return await view.console.gateway.handle(
        _PATH, _HEADERS, read, request_id(), signed_in=(view.principal.key_id, view.key)
    )


def _page(view: View, status: int = 200, **shown: Any) -> Response:
    names = view.console.gateway.model_names(view.key) if view.key else []
    values = {"answer": None, "error": "", **shown}
    return view.render("playground.html", status=status, active="playground", models=names, form=_form(view), **values)


@get("/playground")
async def playground_page(view: View, model: str = "") -> Response:
    """The empty form (`model` chosen where given)."""
    view.form = {"model": model}
    return _page(view)


@post("/playground")
async def playground_ask(view: View) -> Response:
    """The form answered whole (JavaScript off): the answer, its tokens and how long it took."""
    try:
        body = _body(view, stream=False)
        started = time.perf_counter()
        got = await _ask(view, body)
    except Refused as exc:
        return _page(view, exc.status, error=exc.message)
    except ApiError as exc:
        return _page(view, exc.status, error=exc.message)
    took = time.perf_counter() - started
    assert isinstance(got, Answer)
    answer = msgspec.json.decode(got.body)
    if got.status != 200:
        return _page(view, got.status, error=answer.get("error", {}).get("message", str(got.status)))
    usage = answer.get("usage") or {}
    done = usage.get("completion_tokens", 0)
    shown = {
        "text": answer["choices"][0]["message"].get("content") or "",
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": done,
        "seconds": took,
        "tokens_per_s": done / took if took > 0 else 0.0,
        "replica_model": answer.get("model", ""),
    }
    return _page(view, answer=shown)


@post("/playground/stream")
async def playground_stream(view: View) -> Response | Stream:
    """The form's answer as the engine streams it (server-sent events, OpenAI's chunks, usage
    last), for `playground.js`; a refusal in OpenAI's error body with its status."""
    try:
        got = await _ask(view, _body(view, stream=True))
    except Refused as exc:
        return Response({"error": {"message": exc.message}}, status_code=exc.status)
    except ApiError as exc:
        return Response(exc.body(), status_code=exc.status)
    if isinstance(got, Answer):
        return Response(got.body, status_code=got.status, media_type="application/json")

    async def piped(relay: Relay) -> AsyncIterator[bytes]:
        try:
            async for piece in relay.chunks:
                yield piece
        finally:
            await relay.close()

    return Stream(piped(got), media_type="text/event-stream", headers={"cache-control": "no-store"})


ROUTES = (playground_page, playground_ask, playground_stream)
