"""The bus on a real nats-server: typed endpoints, errors as headers, traces across the hop."""

import asyncio
import gc
import weakref

import msgspec
import nats.micro
import pytest
from nats.errors import ConnectionClosedError, FlushTimeoutError
from opentelemetry import trace

from llmgw.bus import (
    BusConfig,
    BusError,
    ConfigError,
    Context,
    HttpServer,
    NotFound,
    call,
    call_all,
    collector_paused,
    connect,
    delete_under,
    flushed,
    load_config,
    meminfo_mb,
    request_raw,
    setup_tracing,
)
from llmgw.proto import Empty, Endpoint, ModelRef

ECHO = Endpoint("echo", "ref.echo", ModelRef, ModelRef, "Answers with what it was sent (a test endpoint).")
EACH = Endpoint(
    "echo", "ref.each", ModelRef, ModelRef, "Every instance answers (a test endpoint).", every_instance=True
)
MINE = Endpoint("echo", "ref.mine", ModelRef, ModelRef, "One node's own (a test endpoint).", per_node=True)
NOBODY = Endpoint("nobody", "ref.echo", Empty, Empty, "Served by nobody (a test endpoint).")

setup_tracing("test", "0.0.0")


class _App:
    name, version, description = "echo", "1.2.3", "test service"

    def ready(self):
        return True


async def _echo_service(nc):
    service = await nats.micro.add_service(nc, name="llmgw-echo", version="1.2.3")
    ctx = Context(_App(), BusConfig(), nc, service)
    seen = {}

    async def echo(ref: ModelRef) -> ModelRef:
        seen["trace_id"] = trace.get_current_span().get_span_context().trace_id
        if ref.name == "missing":
            raise NotFound("model 'missing' is not in the catalog")
        if ref.name == "boom":
            raise RuntimeError("it broke")
        return ref

    await ctx.serve(ECHO, echo)
    return service, seen


async def test_a_typed_request_gets_its_typed_reply(nc):
    await _echo_service(nc)
    assert await call(nc, ECHO, ModelRef(name="m1")) == ModelRef(name="m1")


async def test_an_endpoint_is_served_in_its_services_group_under_its_table_name(nc):
    service, _ = await _echo_service(nc)
    [endpoint] = service.info().endpoints
    assert (endpoint.name, endpoint.subject) == ("ref-echo", "llmgw.v1.echo.ref.echo")


async def test_a_per_node_endpoint_answers_only_for_its_node(nc):
    service = await nats.micro.add_service(nc, name="llmgw-echo", version="1.2.3")
    ctx = Context(_App(), BusConfig(node="a"), nc, service)

    async def mine(ref: ModelRef) -> ModelRef:
        return ModelRef(name=f"{ref.name}-a")

    await ctx.serve(MINE, mine, node="a")
    assert await call(nc, MINE, ModelRef(name="x"), node="a") == ModelRef(name="x-a")
    with pytest.raises(BusError, match="nobody answers on llmgw.v1.echo.b.ref.mine"):
        await call(nc, MINE, ModelRef(name="x"), node="b", timeout=1)
    with pytest.raises(ValueError, match="per node"):
        MINE.subject()


async def test_a_malformed_message_gets_a_400_naming_the_field_and_the_service_carries_on(nc):
    await _echo_service(nc)
    msg = await request_raw(nc, ECHO.subject(), b'{"name": "has.dot"}', timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    assert "name must be letters, digits" in msg.headers["Nats-Service-Error"]
    msg = await request_raw(nc, ECHO.subject(), b"not json", timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    assert await call(nc, ECHO, ModelRef(name="ok")) == ModelRef(name="ok")


async def test_errors_travel_as_their_codes(nc):
    await _echo_service(nc)
    with pytest.raises(NotFound, match="not in the catalog"):
        await call(nc, ECHO, ModelRef(name="missing"))
    with pytest.raises(Exception, match="RuntimeError: it broke") as info:
        await call(nc, ECHO, ModelRef(name="boom"))
    assert info.value.code == "500"


async def test_a_trace_crosses_the_nats_hop(nc):
    _, seen = await _echo_service(nc)
    with trace.get_tracer("test").start_as_current_span("client") as span:
        await call(nc, ECHO, ModelRef(name="m"))
    assert seen["trace_id"] == span.get_span_context().trace_id


async def test_srv_ping_lists_the_service_with_its_version(nc):
    await _echo_service(nc)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("$SRV.PING.llmgw-echo", b"", reply=inbox)
    msg = await sub.next_msg(timeout=5)
    ping = msgspec.json.decode(msg.data)
    assert (ping["name"], ping["version"]) == ("llmgw-echo", "1.2.3")


async def test_nobody_answering_says_which_subject(nc):
    with pytest.raises(Exception, match="nobody answers on llmgw.v1.nobody.ref.echo"):
        await call(nc, NOBODY, Empty(), timeout=1)


class _Cfg(BusConfig, kw_only=True):
    slots: int = 1


def test_config_comes_from_file_then_environment_then_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('slots = 2\nnode = "from-file"\n')
    cfg = load_config(_Cfg, ["--config", str(f), "--slots", "4"], env={"LLMGW_NODE": "from-env"})
    assert (cfg.slots, cfg.node) == (4, "from-env")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slotz", "3"], "unknown flag --slotz"),
        (["--slots", "many"], "slots"),
        (["--slots"], "needs a value"),
        (["stray"], "unexpected argument"),
    ],
)
def test_a_bad_setting_says_which(argv, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_Cfg, argv, env={})


async def test_a_client_reconnects_when_nats_restarts_on_the_same_port(tmp_path):
    from llmgw.bus import connect, start_nats_server

    first = start_nats_server(tmp_path / "nats")
    nc = await connect(first.url, "test")
    try:
        await _echo_service(nc)
        first.stop()
        second = start_nats_server(tmp_path / "nats", port=first.port)
        try:
            answer = None
            for _ in range(40):  # the client notices the drop, reconnects, and resubscribes
                try:
                    answer = await call(nc, ECHO, ModelRef(name="back"), timeout=0.5)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            assert answer == ModelRef(name="back") and nc.stats["reconnects"] >= 1
        finally:
            second.stop()
    finally:
        await nc.close()


def test_a_nats_port_taken_is_one_sentence_naming_the_port_and_the_flag(tmp_path):
    """A second `llmgw up` on the default port: the cause was the last line of a log dump after
    'did not start listening within 20.0s'."""
    from llmgw.bus import BusError, start_nats_server

    first = start_nats_server(tmp_path / "first")
    try:
        with pytest.raises(BusError) as taken:
            start_nats_server(tmp_path / "second", port=first.port)
        message = taken.value.message
        assert f"could not listen on 127.0.0.1:{first.port}" in message and "--nats-port" in message, message
        assert "\n" not in message
    finally:
        first.stop()


async def test_gather_hears_every_instance_in_its_own_queue_and_errors_as_errors(nc):
    services = []
    for node in ("a", "b", "c"):
        service = await nats.micro.add_service(nc, name="llmgw-echo", version="1.2.3")
        ctx = Context(_App(), BusConfig(node=node), nc, service)

        async def answer(ref: ModelRef, node=node) -> ModelRef:
            if node == "c":
                raise NotFound(f"node {node} has no '{ref.name}'")
            return ModelRef(name=f"{ref.name}-{node}")

        await ctx.serve(EACH, answer)
        services.append(service)
    answers = await call_all(nc, EACH, ModelRef(name="x"), window_s=0.5)
    assert sorted(a.name for a in answers if isinstance(a, ModelRef)) == ["x-a", "x-b"]
    assert [a.message for a in answers if isinstance(a, BusError)] == ["node c has no 'x'"]
    assert await call_all(nc, NOBODY, Empty(), window_s=0.2) == []
    for service in services:
        await service.stop()


async def test_gather_stops_at_the_first_reply_until_accepts(nc):
    services = []
    for node in ("a", "b"):
        service = await nats.micro.add_service(nc, name="llmgw-echo", version="1.2.3")
        ctx = Context(_App(), BusConfig(node=node), nc, service)

        async def answer(ref: ModelRef, node=node) -> ModelRef:
            return ModelRef(name=f"{ref.name}-{node}")

        await ctx.serve(EACH, answer)
        services.append(service)
    answers = await call_all(nc, EACH, ModelRef(name="x"), window_s=30.0, until=lambda a: True)
    assert len(answers) == 1 and answers[0].name in ("x-a", "x-b")  # not the window's 30 s and both
    for service in services:
        await service.stop()


def test_delete_under_removes_the_file_its_sidecars_and_empty_folders_but_never_climbs_out(tmp_path):
    root = tmp_path / "root"
    (root / "o" / "r").mkdir(parents=True)
    (root / "o" / "r" / "f.gguf").write_bytes(b"x")
    (root / "o" / "r" / ".f.gguf.sha256").write_bytes(b"{}")
    (root / "o" / "keep.txt").write_bytes(b"y")
    assert delete_under(root, "o/r/f.gguf") is True
    assert not (root / "o" / "r").exists() and (root / "o" / "keep.txt").exists()
    assert delete_under(root, "o/r/f.gguf") is False
    (tmp_path / "outside").write_bytes(b"z")
    with pytest.raises(ValueError, match="is not under"):
        delete_under(root, "../outside")
    assert (tmp_path / "outside").exists()


def test_meminfo_gives_total_and_available_in_mib():
    text = "MemTotal:       24683520 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n"
    assert meminfo_mb(text) == (24105, 20000)


def test_the_collector_is_off_inside_a_paused_block_and_takes_its_young_objects_after(monkeypatch):
    real, asked = gc.collect, []
    monkeypatch.setattr(gc, "collect", lambda *generation: asked.append(generation) or real(*generation))
    real()
    with collector_paused():
        pass
    assert asked == []  # nothing due: no collection
    held = []
    with collector_paused():
        assert not gc.isenabled()
        held.extend([i] for i in range(50 * gc.get_threshold()[0]))  # tracked and kept: due many times over
        assert gc.get_count()[0] >= len(held)
    assert gc.isenabled()
    assert asked == [(0,)]  # the young generation, once, at the block's end


def test_a_cycle_made_while_the_collector_is_paused_waits_for_the_next_collection():
    class Node:
        pass

    gc.collect()
    with collector_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        held = [[i] for i in range(50 * gc.get_threshold()[0])]  # would have set off collections
        assert gone() is not None  # none ran: counts alone cannot free a cycle
    del held
    gc.collect()
    assert gone() is None  # the next full collection frees it: nothing is lost


def test_a_paused_collector_is_given_back_as_it_was_even_when_the_block_fails():
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the block failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


async def test_the_http_servers_connections_turn_nagle_off():
    """A listener without IPPROTO_TCP hands out sockets that asyncio leaves with Nagle on: every
    keep-alive request then waits ~40 ms for a delayed ACK (uvicorn #3149)."""
    import socket

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        elif scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    server = HttpServer(app, "127.0.0.1", 0)
    assert server.sock.proto == socket.IPPROTO_TCP
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await server.stop()


async def test_a_subscription_flushed_on_one_connection_hears_what_another_publishes_next(nc, nats_server):
    """`flushed` waits until the server has read what the client wrote. nats-py 2.16's own
    flush() sends its PING ahead of commands still queued, so a subscription "flushed" that way
    could reach the server after another connection's message (1 try in 12 lost it here)."""
    harness = str(nats_server.folder / "creds" / "harness.nk")
    speaker = await connect(nats_server.url, "speaker", creds=harness)
    try:
        for i in range(200):
            sub = await nc.subscribe(f"test.flushed.{i}")
            await flushed(nc)
            await speaker.publish(f"test.flushed.{i}", b"heard")
            await flushed(speaker)
            assert (await sub.next_msg(timeout=5)).data == b"heard", f"try {i}"
            await sub.unsubscribe()
    finally:
        await speaker.close()


async def test_flushed_gives_up_after_its_timeout_on_a_queue_that_is_never_written(nc, monkeypatch):
    async def never(force_flush=False):
        try:
            await asyncio.Event().wait()  # a flusher that never gets to it
        except asyncio.CancelledError:
            pass  # swallowed, as nats-py 2.16's own _flush_pending does

    monkeypatch.setattr(nc, "_flush_pending", never)
    with pytest.raises(FlushTimeoutError):
        await flushed(nc, timeout=0.2)


async def test_flushed_on_a_closed_client_says_it_is_closed(nats_server):
    closed = await connect(nats_server.url, "closed", creds=str(nats_server.folder / "creds" / "harness.nk"))
    await closed.close()
    with pytest.raises(ConnectionClosedError):
        await flushed(closed)
