"""Bad input over NATS: a clear error, never a traceback, and the service carries on."""

import asyncio

import nats.micro
import pytest
from structlog.testing import capture_logs

from llmgw.bus import BusConfig, Context, call, flushed, request_raw
from llmgw.proto import JSON_MAX_DEPTH, Endpoint, JsonTooDeep, ModelRef, check_depth, decode_json

ECHO = Endpoint("echo", "ref.echo", ModelRef, ModelRef, "Answers with what it was sent (a test endpoint).")


class _App:
    name, version, description = "echo", "1.2.3", "test service"

    def ready(self):
        return True


async def _echo(nc):
    service = await nats.micro.add_service(nc, name="llmgw-echo", version="1.2.3")
    ctx = Context(_App(), BusConfig(), nc, service)
    handled = []

    async def echo(ref: ModelRef) -> ModelRef:
        handled.append(ref.name)
        return ref

    await ctx.serve(ECHO, echo)
    return handled


def _nested(depth: int) -> bytes:
    return b'{"name": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [JSON_MAX_DEPTH + 1, 1000, 100_000])
async def test_json_nested_too_deep_gets_a_400_saying_so_and_the_service_carries_on(nc, depth):
    handled = await _echo(nc)
    with capture_logs() as logs:
        msg = await request_raw(nc, ECHO.subject(), _nested(depth), timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    assert f"nested deeper than {JSON_MAX_DEPTH} levels" in msg.headers["Nats-Service-Error"]
    assert "RecursionError" not in msg.headers["Nats-Service-Error"] and logs == [] and handled == []
    assert await call(nc, ECHO, ModelRef(name="ok")) == ModelRef(name="ok")


def test_nesting_is_counted_in_arrays_and_objects_but_not_inside_strings():
    check_depth(b"[" * JSON_MAX_DEPTH + b"]" * JSON_MAX_DEPTH)
    check_depth(b'["' + b"[{" * 1000 + b'"]')
    check_depth(b'["\\"' + b"[" * 1000 + b'"]')
    with pytest.raises(JsonTooDeep, match="deeper than 3 levels"):
        check_depth(b'{"a": [{"b": []}]}', most=3)
    assert decode_json(b'{"a": [{"b": []}]}', most=4) == {"a": [{"b": []}]}
    with pytest.raises(JsonTooDeep):
        decode_json(b"[" * 100_000 + b"]" * 100_000)


async def test_a_request_without_a_reply_subject_is_not_run_and_is_logged_once_without_a_traceback(nc):
    handled = await _echo(nc)
    with capture_logs() as logs:
        for name in ("a", "b"):
            await nc.publish(ECHO.subject(), b'{"name": "%s"}' % name.encode())
        await flushed(nc)
        await asyncio.sleep(0.3)
    assert handled == []
    assert [(e["log_level"], e["event"]) for e in logs] == [("warning", "request without a reply subject refused")]
    assert "exc_info" not in logs[0] and logs[0]["subject"] == ECHO.subject()
    assert await call(nc, ECHO, ModelRef(name="ok")) == ModelRef(name="ok")
