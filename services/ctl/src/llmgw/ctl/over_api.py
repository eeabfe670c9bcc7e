"""`llmgw ctl --api URL`: ctl's operations through a router's admin API with an API key instead
of the fleet's NATS credentials — what a member or an operator has (a key their user owns), or
an admin's key from another machine. Each operation is asked at its endpoint's admin route, so
the router holds it to the one rule its other faces follow and narrows what it answers. The key
comes from $LLMGW_API_KEY, never the command line (it would show in `ps` and the shell's history).
"""

from __future__ import annotations

import asyncio
import json
import re
import string
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmgw.proto import PREFIX, catalog, knowledge, mirror, people, router, scheduler
from llmgw.proto._endpoint import AdminRoute
from llmgw.proto.errors import BadRequest, from_code

__all__ = ["API_KEY_ENV", "AdminApi"]

API_KEY_ENV = "LLMGW_API_KEY"
"""Where `--api` finds the key to send."""

_BESIDE = {  # the model changes the admin API serves with routes of its own (they check the name twice)
    catalog.MODEL_CHANGE: AdminRoute("POST", "/models/{name}/change"),
    catalog.MODEL_REMOVE: AdminRoute("DELETE", "/models/{name}"),
    catalog.MODEL_PURGE: AdminRoute("POST", "/models/{name}/purge", body=False),
}
_ROUTES: dict[str, AdminRoute] = {
    e.subject(): _BESIDE.get(e) or e.admin
    for table in (
        catalog.ENDPOINTS,
        mirror.ENDPOINTS,
        scheduler.ENDPOINTS,
        router.ENDPOINTS,
        people.ENDPOINTS,
        knowledge.ENDPOINTS,
    )
    for e in table
    if e.admin is not None or e in _BESIDE
}
_ERROR_CODES = {400: "400", 404: "404", 409: "409"}
"""HTTP statuses that keep their bus meaning; the rest read as the service's own failure (Internal)."""


@dataclass
class _Reply:
    """What `llmgw.bus.call` reads of a NATS reply: its bytes and its headers."""

    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


class AdminApi:
    """Stands where ctl's NATS connection stands for `llmgw.bus.call`: `request` sends the
    endpoint a subject names to the router's admin API (`/api/v1`) and gives back its answer as a
    reply, a refusal in the headers a service error has."""

    def __init__(self, url: str, key: str) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self._auth = {"authorization": f"Bearer {key}", "accept": "application/json"}

    async def request(
        self, subject: str, payload: bytes = b"", timeout: float = 10.0, headers: dict[str, str] | None = None
    ) -> _Reply:
        """The admin API's answer to what `payload` asks of the endpoint on `subject`."""
        if subject not in _ROUTES:
            what = subject.removeprefix(PREFIX + ".")
            why = f"`{what}` is not on the admin API; ask it with the fleet's NATS credentials"
            return _Reply(b"", {"Nats-Service-Error-Code": "400", "Nats-Service-Error": why})
        method, url, body = self.http_request(_ROUTES[subject], msgspec.json.decode(payload))
        return await asyncio.to_thread(self._send, method, url, body, timeout)

    def http_request(self, route: AdminRoute, message: dict[str, Any]) -> tuple[str, str, bytes | None]:
        """The method, URL and body that ask `message` at admin route `route`."""
        values = {k: v for k, v in message.items() if k != "by"}  # the router says who asks
        taken: dict[str, str] = {}
        for name, template in route.fields:
            if name in values:
                taken |= _unformat(template, str(values.pop(name)))
        params = [p for _, p, _, _ in string.Formatter().parse(route.path) if p]
        for p in params:
            if p not in taken and p in values:
                taken[p] = str(values.pop(p))
        path = route.path.format(**{k: urllib.parse.quote(v, safe="") for k, v in taken.items()})
        if route.method in ("POST", "PUT") and route.body:
            return route.method, self.base + path, json.dumps(values).encode()
        query = {k: _query_value(v) for k, v in values.items() if v is not None and v != [] and v != ""}
        url = self.base + path + (f"?{urllib.parse.urlencode(query, doseq=True)}" if query else "")
        return route.method, url, None

    def _send(self, method: str, url: str, body: bytes | None, timeout: float) -> _Reply:
        headers = self._auth | ({"content-type": "application/json"} if body is not None else {})
        return self._open(urllib.request.Request(url, data=body, method=method, headers=headers), timeout)

    def _open(self, sent: urllib.request.Request, timeout: float) -> _Reply:
        try:
            with urllib.request.urlopen(sent, timeout=timeout) as answer:
                return _Reply(answer.read())
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                said = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                said = text.decode(errors="replace")[:300]
            code = _ERROR_CODES.get(exc.code, "500")
            return _Reply(b"", {"Nats-Service-Error-Code": code, "Nats-Service-Error": f"{said} (HTTP {exc.code})"})
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionError(f"the admin API at {self.base} does not answer: {reason}") from None

    async def put_document(self, tenant: str, base: str, path: str, data: bytes) -> dict[str, Any]:
        """A document sent to a knowledge base (`PUT /knowledge/{tenant}/{base}/documents/{path}`):
        the `Document` kept, or BadRequest/NotFound in the router's words."""
        where = "/".join(urllib.parse.quote(p, safe="") for p in (tenant, base))
        url = f"{self.base}/knowledge/{where}/documents/{urllib.parse.quote(path, safe='/')}"
        headers = self._auth | {"content-type": "application/octet-stream"}
        sent = urllib.request.Request(url, data=data, method="PUT", headers=headers)
        reply = await asyncio.to_thread(self._open, sent, 120.0)
        if "Nats-Service-Error" in reply.headers:
            raise from_code(reply.headers["Nats-Service-Error-Code"], reply.headers["Nats-Service-Error"])
        return json.loads(reply.data)

    async def close(self) -> None:
        """Nothing held open between requests."""

    def __getattr__(self, name: str) -> Any:
        """A command that reads NATS itself (a bucket, a stream, events) has no admin route."""
        raise BadRequest(f"this command reads NATS itself ({name}); run it with the fleet's NATS credentials")


def _unformat(template: str, value: str) -> dict[str, str]:
    """The path parameters a field's value was made of: `{owner}/{name}` and 'a/b'."""
    pattern = "".join(
        re.escape(text) + (f"(?P<{name}>[^/]+)" if name else "")
        for text, name, _, _ in string.Formatter().parse(template)
    )
    found = re.fullmatch(pattern, value)
    if found is None:
        raise ValueError(f"'{value}' is not of the form {template}")
    return found.groupdict()


def _query_value(value: Any) -> Any:
    """A field as a query string carries it: booleans as true/false, the rest as they print."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
