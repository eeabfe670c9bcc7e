"""Run a service: NATS, nats.micro endpoints with typed messages, admin HTTP, signals."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
import nats.micro
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.micro.request import Request
from nats.micro.service import ServiceConfig
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from llmgw.bus._access import CredentialsError
from llmgw.bus._config import BusConfig, load_config
from llmgw.bus._disk import DiskCollector, disk_note
from llmgw.bus._gauges import ScrapeCollector, nats_series
from llmgw.bus._nats import connect, flushed, set_storage_replicas
from llmgw.bus._observe import TracingError, extract, get_logger, setup_logging, setup_tracing
from llmgw.bus._signing import SignatureError, Verifier
from llmgw.proto import Endpoint, decode_json, plainly, type_name
from llmgw.proto.errors import BadRequest, BusError

__all__ = ["INBOX", "Context", "ServiceApp", "add_service", "answerable", "entry_point", "run"]

INBOX = "_INBOX."
"""Where every answer goes: an asker's inbox (each identity's are `_INBOX.<its public key>`)."""


def answerable(reply: str) -> bool:
    """Whether a service may answer on `reply`: an inbox, never a subject others act on (an event,
    another service's request, a JetStream ack), which an asker could otherwise name as its reply
    and have the service publish there under its own identity."""
    return reply.startswith(INBOX)


class _Service(nats.micro.Service):
    """nats.micro's service, its discovery (PING, INFO, STATS) answered only on inboxes too."""

    async def _handle_ping_request(self, msg: Msg) -> None:
        if answerable(msg.reply):
            await super()._handle_ping_request(msg)

    async def _handle_info_request(self, msg: Msg) -> None:
        if answerable(msg.reply):
            await super()._handle_info_request(msg)

    async def _handle_stats_request(self, msg: Msg) -> None:
        if answerable(msg.reply):
            await super()._handle_stats_request(msg)


async def add_service(nc: Client, **config: Any) -> nats.micro.Service:
    """A started nats.micro service (`nats.micro.add_service`'s settings) that answers its
    discovery only on inboxes."""
    service = _Service(nc, ServiceConfig(**config))
    await service.start()
    return service


Handler = Callable[[Any], Awaitable[msgspec.Struct]]
Req = TypeVar("Req")
Rep = TypeVar("Rep")
C = TypeVar("C", bound=BusConfig)


class ServiceApp(Protocol):
    """What a service implements; `run` does the rest."""

    name: str
    version: str
    description: str

    async def start(self, ctx: Context) -> None:
        """Open buckets, add endpoints, start background tasks."""

    async def stop(self) -> None:
        """Finish what is in flight and release what it holds."""

    handover: bool = False
    """Set when it is stopped by SIGUSR1 rather than SIGTERM: its successor (an upgrade's) takes
    over, so what can be left running for it is (the agent's ready engines)."""

    def ready(self) -> bool:
        """Whether it can do its work now (served on /readyz; where not, an app may say why in
        a `why_not_ready() -> str` of its own, which /readyz's body then names)."""


class Context:
    """What a started service gets: its connection, JetStream, endpoints, metrics."""

    def __init__(self, app: ServiceApp, config: BusConfig, nc: Client, service: nats.micro.Service) -> None:
        self.app = app
        self.config = config
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.service = service
        self.log = get_logger(app.name)
        self.metrics = CollectorRegistry()
        self._requests = Counter("llmgw_requests", "NATS requests handled", ["subject", "code"], registry=self.metrics)
        self._latency = Histogram("llmgw_request_seconds", "NATS request latency", ["subject"], registry=self.metrics)
        self.metrics.register(DiskCollector(config.home()))
        self.metrics.register(ScrapeCollector(nats_series(nc)))
        self._tracer = trace.get_tracer(f"llmgw.{app.name}")
        self.started = time.time()
        self.admin_port = 0
        self._groups: dict[str, nats.micro.service.Group] = {}
        self._unanswerable: set[tuple[str, str]] = set()
        """(subject, what was wrong) of requests not run for their reply subject (each logged once)."""
        self._foreign: set[str] = set()
        """Subjects a request speaking for another node came on (each logged once)."""

    async def serve(
        self,
        endpoint: Endpoint[Req, Rep],
        handler: Callable[[Req], Awaitable[Rep]],
        node: str = "",
        verifier: Verifier | None = None,
    ) -> None:
        """Serve one endpoint of this service's table under its nats.micro group (`node`: for the
        agent's per-node endpoints). Endpoints every instance answers get the node's own queue
        group, so each instance answers; the rest share one queue (a request goes to one). One
        that speaks for a node is served for every node (its subject's last token). `verifier`:
        only requests it finds signed are run (an endpoint `signed_by` a role)."""
        group = endpoint.group(node)
        if group not in self._groups:
            self._groups[group] = self.service.add_group(name=group)
        queue = self.config.node_name() if endpoint.every_instance else None
        served = f"{endpoint.name}.*" if endpoint.speaks_for else endpoint.name
        subject = endpoint.pattern if endpoint.speaks_for else endpoint.subject(node)  # one metrics label
        serve = self._handler(endpoint, subject, handler, verifier)
        await self._groups[group].add_endpoint(
            name=endpoint.micro_name, subject=served, handler=serve, queue_group=queue
        )

    def _answerable(self, subject: str, req: Request) -> bool:
        """Whether a request may be answered: it has a reply subject, and that is an inbox. Else it
        is not run (nobody could learn its answer, or the answer would land where others act on
        it): counted, and a warning the first time on each subject for each of the two."""
        reply = req._msg.reply  # nats.micro's Request keeps its message private; only the reply is read
        if reply and answerable(reply):
            return True
        why = "no_reply" if not reply else "not_inbox"
        self._requests.labels(subject, why).inc()
        if (subject, why) not in self._unanswerable:
            self._unanswerable.add((subject, why))
            if why == "no_reply":
                self.log.warning(
                    "request without a reply subject refused",
                    subject=req.subject,
                    hint="send it as a request (nats req), not a publish; later ones are counted, not logged",
                )
            else:
                self.log.warning(
                    "request whose reply subject is not an inbox refused",
                    subject=req.subject,
                    reply=reply[:200],
                    hint=f"answers go only to {INBOX}...; later ones are counted, not logged",
                )
        return False

    async def _signed(self, verifier: Verifier | None, subject: str, req: Request) -> bool:
        """Whether a request may be run by its signature (`verifier` None: nothing is checked). One
        not signed rightly gets a 400 saying why, and a warning each time: only the signing role
        may send here, so a refusal is an attack or a fault."""
        if verifier is None:
            return True
        try:
            verifier.check(req.subject, req.data or b"", req.headers, time.time())
        except SignatureError as exc:
            self._requests.labels(subject, exc.code).inc()
            self.log.warning("request refused: not signed rightly", subject=req.subject, why=exc.message)
            await req.respond_error(exc.code, exc.message)
            return False
        return True

    def _speaker(self, endpoint: Endpoint, subject: str, msg: object) -> None:
        """Refuse (400) a request whose message speaks for another node than its subject names."""
        named, asker = getattr(msg, endpoint.speaks_for), endpoint.asker(subject)
        if named == asker:
            return
        if subject not in self._foreign:  # one per subject: the server lets only that node send here
            self._foreign.add(subject)
            self.log.warning("request for another node refused", subject=subject, claims=named)
        raise BadRequest(
            f"{type_name(endpoint.request)} on {subject} names node '{named}': a node speaks only for itself, "
            f"on its own subject ({endpoint.subject(named or '<node>')})"
        )

    def _handler(
        self, endpoint: Endpoint, subject: str, handler: Handler, verifier: Verifier | None
    ) -> Callable[[Request], Awaitable[None]]:
        """`handler` as nats.micro calls it: the request decoded, the reply or the error sent back.

        A malformed or invalid message (JSON nested too deep among them) gets a 400 naming the
        field, and so does one speaking for another node than its subject, or not signed rightly
        (`_signed`); a BusError its own code; anything else a 500. A request without a reply
        subject, or whose reply subject is not an inbox, is not run (`_answerable`). The service
        carries on in every case.
        """
        request_type = endpoint.request

        async def serve(req: Request) -> None:
            if not self._answerable(subject, req) or not await self._signed(verifier, subject, req):
                return
            with (
                self._tracer.start_as_current_span(
                    subject if "*" not in subject else req.subject,
                    context=extract(req.headers),
                    kind=trace.SpanKind.SERVER,
                ),
                self._latency.labels(subject).time(),
            ):
                code = "200"
                try:
                    msg = decode_json(req.data or b"{}", type=request_type)
                    if endpoint.speaks_for:
                        self._speaker(endpoint, req.subject, msg)
                    reply = await handler(msg)
                    await req.respond(msgspec.json.encode(reply))
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    code = "400"
                    said = plainly(exc, type_name(request_type))  # a DecodeError: its own words
                    await req.respond_error(code, f"{said} ({type_name(request_type)} on {req.subject})")
                except BusError as exc:
                    code = exc.code
                    await req.respond_error(code, exc.message)
                except Exception as exc:  # the service carries on; the caller learns why
                    code = "500"
                    self.log.exception("handler failed", subject=req.subject)
                    await req.respond_error(code, f"{type(exc).__name__}: {exc}")
                self._requests.labels(subject, code).inc()

        return serve


async def _admin_server(context: Callable[[], Context | None], host: str, port: int) -> asyncio.Server:
    """A small HTTP/1.1 server for /healthz, /readyz, /metrics and /info (`context()` is the
    started service's, None while it starts: then only /healthz answers ok)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            ctx = context()
            status, ctype, body = _admin_answer(ctx, path) if ctx else _starting(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


def _starting(path: str) -> tuple[str, str, bytes]:
    """The admin answers before the service has started."""
    if path == "/healthz":
        return "200 OK", "text/plain", b"ok\n"
    return "503 Service Unavailable", "text/plain", b"starting\n"


def _admin_answer(ctx: Context, path: str) -> tuple[str, str, bytes]:
    if path == "/healthz":
        return "200 OK", "text/plain", b"ok\n"
    if path == "/readyz":
        ok = ctx.nc.is_connected and ctx.app.ready()
        disk = disk_note(ctx.config.home())  # said either way: ready or not, it serves on until full
        if ok:
            return "200 OK", "text/plain", f"ready{'; ' + disk if disk else ''}\n".encode()
        why = "NATS is away" if not ctx.nc.is_connected else getattr(ctx.app, "why_not_ready", lambda: "")()
        why = "; ".join(w for w in (why, disk) if w)
        return "503 Service Unavailable", "text/plain", f"not ready{': ' + why if why else ''}\n".encode()
    if path == "/metrics":
        return "200 OK", "text/plain; version=0.0.4", generate_latest(ctx.metrics)
    if path == "/info":
        info = {
            "service": ctx.app.name,
            "version": ctx.app.version,
            "node": ctx.config.node_name(),
            "id": ctx.service.id,
            "started": ctx.started,
            "nats_connected": ctx.nc.is_connected,
            "endpoints": [e.subject for e in ctx.service.info().endpoints],
        }
        return "200 OK", "application/json", msgspec.json.encode(info)
    return "404 Not Found", "text/plain", b"unknown path; try /healthz /readyz /metrics /info\n"


async def _main(app: ServiceApp, config: BusConfig) -> None:
    log = get_logger(app.name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def hand_over() -> None:  # SIGUSR1: a successor (an upgrade's) takes over what it leaves running
        app.handover = True
        stop.set()

    loop.add_signal_handler(signal.SIGUSR1, hand_over)
    set_storage_replicas(config.storage_replicas)
    started: list[Context] = []
    try:  # before NATS: a port taken starts nothing
        admin = await _admin_server(lambda: started[0] if started else None, config.admin_host, config.admin_port)
    except OSError as exc:
        raise BusError(
            f"admin HTTP on {config.admin_host}:{config.admin_port}: {exc.strerror}; "
            "set admin_port to a free port (0 picks one; `nats micro info` then says which)"
        ) from None
    nc = await connect(
        config.nats_url, f"llmgw-{app.name}-{config.node_name()}", creds=config.creds, tls_ca=config.tls_ca
    )
    port = admin.sockets[0].getsockname()[1]
    # Where Prometheus scrapes it: in nats.micro's INFO (`nats micro info llmgw-<name>`) and /info.
    metadata = {"admin": f"http://{config.admin_host}:{port}", "node": config.node_name()}
    service = await add_service(
        nc, name=f"llmgw-{app.name}", version=app.version, description=app.description, metadata=metadata
    )
    ctx = Context(app, config, nc, service)
    ctx.admin_port = port
    started.append(ctx)
    await app.start(ctx)
    try:  # its endpoints' subscriptions are the server's before it says it started
        await flushed(nc)
    except NatsError as exc:  # a busy or reconnecting server: they reach it later, and askers resend a while
        log.warning("NATS has not confirmed the endpoints yet", error=str(exc) or type(exc).__name__)
    gc.collect()
    gc.freeze()  # what start made (modules, apps, tables) is never traversed by a collection again
    log.info("started", version=app.version, admin_port=ctx.admin_port, nats=config.nats_url)
    await stop.wait()
    log.info("stopping")
    try:
        await app.stop()
    finally:
        await service.stop()
        admin.close()
        await nc.drain()
        log.info("stopped")


def run(app: ServiceApp, config: BusConfig) -> int:
    """Run `app` until SIGTERM or SIGINT; returns the process exit status."""
    setup_logging(app.name, config.node_name(), config.log_level)
    try:
        setup_tracing(app.name, app.version, config.node_name())
    except TracingError as exc:  # a setting of the environment: said, nothing started
        get_logger(app.name).error("cannot start", error=str(exc))
        return 2
    try:
        # uvloop: the event loop in C (libuv); every service is I/O bound, the router most.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_main(app, config))
    except CredentialsError as exc:  # wrong, missing or refused credentials: which file, and what to do
        get_logger(app.name).error("cannot start", error=exc.message)
        return 2
    except BusError as exc:  # a bad setting or file found at start: say it, no traceback
        get_logger(app.name).error("cannot start", error=exc.message)
        return 1
    return 0


def entry_point(app_type: Callable[[C], ServiceApp], config_type: type[C]) -> Callable[[list[str] | None], int]:
    """A service's `main`: its one config Struct from `--config FILE`, `LLMGW_*` and flags, then `run`.

    Each service module says `main = entry_point(Catalog, CatalogConfig)`; `llmgw service NAME`,
    systemd and Nix call it.
    """

    def main(argv: list[str] | None = None) -> int:
        config = load_config(config_type, argv)
        try:
            app = app_type(config)  # reads the files it needs (an engine secret) before connecting
        except CredentialsError as exc:
            setup_logging(getattr(app_type, "name", "llmgw"), config.node_name(), config.log_level)
            get_logger(getattr(app_type, "name", "llmgw")).error("cannot start", error=exc.message)
            return 2
        return run(app, config)

    main.__doc__ = f"Run {getattr(app_type, 'name', app_type.__name__)} until SIGTERM or SIGINT."
    return main
