"""`llmgw up`: NATS with JetStream, every service as its own process, an agent, a demo model
(SmolLM2 taken in by the mirror through its verified path: `llmgw.ctl.demo`).

What it starts, it keeps: a process that dies is started again after a backoff (`keeper`), said
in one line. A stop drains: the router first (it stops taking requests and lets those in flight
finish for `drain_s`), then the agent (its engines) and the other services, NATS last."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import httpx
import msgspec

from llmgw.bus import (
    BusConfig,
    BusError,
    Cluster,
    Identity,
    NotFound,
    call,
    connect,
    data_home,
    read_identity,
    server_config,
    write_private,
)
from llmgw.ctl.access import (
    agent_nodes,
    engine_secret_file,
    ensure_engine_secrets,
    ensure_identities,
    scheduler_key_file,
)
from llmgw.ctl.cluster import (
    HA_SIZE,
    HaError,
    MemberPass,
    first_member,
    issue_route_certificate,
    members_url,
    public_identities,
    take_member,
    wait_members,
)
from llmgw.ctl.demo import Demo, choose_demo, mirror_config
from llmgw.ctl.join import JOIN_PORT, JoinServer
from llmgw.ctl.keeper import Backoff
from llmgw.ctl.rollout import Rollout
from llmgw.ctl.supervise import Kept, StoreKeeper, listening, spawn_nats, spawn_service, stop_in_order
from llmgw.ctl.upstate import UpState, admin_ports, write_up_state
from llmgw.proto import Empty, KeyCreate, ModelPut, ModelRef, catalog, people, router
from llmgw.proto.people import UserCreate

__all__ = ["Kept", "UpOptions", "up"]

SERVICES = ("catalog", "mirror", "scheduler", "router", "agent")


class UpOptions(msgspec.Struct, kw_only=True):
    """What `llmgw up` was asked for."""

    data_dir: str | None = None
    nats_port: int = 4222
    http_port: int = 8080
    listen: str = "127.0.0.1"
    """Where NATS listens, and (off the loopback) where other machines join (`join.JOIN_PORT`)."""
    ha: list[str] = msgspec.field(default_factory=list)
    """The two other HA machines' addresses: with this one, a NATS cluster of three (`cluster`),
    each with a router; the services start once both have joined."""
    demo: bool = True
    drain_s: float = 10.0
    """At a stop, how long the router lets the requests in flight finish before it cuts them."""
    backoff: Backoff = Backoff()
    """When a process that died is started again."""

    def home(self) -> Path:
        """The data directory."""
        return data_home(self.data_dir).resolve()


def _identities(home: Path, node: str) -> list[tuple[Identity, Path, bool]]:
    """Every identity of the fleet (`ensure_identities`), each agent's engine secret made too."""
    agents = [("agent", n) for n in dict.fromkeys([node, *agent_nodes(home / "creds")])]
    wanted = [(role, "") for role in ("catalog", "scheduler", "mirror", "router", "ctl")] + agents
    written = ensure_identities(home / "creds", wanted)
    ensure_engine_secrets(home / "creds", [n for _, n in agents])  # engine keys are worked out from these
    return written


def _access(
    home: Path, node: str, listen: str = "127.0.0.1", port: int = 4222, cluster: Cluster | None = None
) -> tuple[Path, dict[str, Path], list[Identity]]:
    """Every identity's credentials under <home>/creds (one per service, this node's agent, the
    agents of machines that joined, and the operator: written on first start, reused after) and
    the NATS configuration that lets in only them, each with its role's permissions
    (<home>/nats/server.conf), a member of `cluster` where there is one; and the identities."""
    written = _identities(home, node)
    identities = [identity for identity, _, _ in written]
    creds = {identity.user: path for identity, path, _ in written}
    conf = home / "nats" / "server.conf"
    member = cluster.config() if cluster else ""
    part = conf.with_suffix(".part")  # whole, or not at all: NATS may read it at any SIGHUP
    write_private(part, server_config(identities, home / "nats", host=listen, port=port) + member)
    part.replace(conf)
    return conf, creds, identities


class _Stopped(Exception):
    """A signal came while `up` was starting."""


async def _first_admin(nc) -> str:
    """The first admin user, made where there is no user yet: its password (shown once), else ""."""
    if (await call(nc, people.USER_LIST, Empty())).users:
        return ""
    made = await call(nc, people.USER_CREATE, UserCreate(name="admin", role="admin", by="llmgw up"))
    return made.password


async def _setup(
    nats_url: str, home: Path, demo: Demo | None, creds: Path, tend: Callable[[], None]
) -> tuple[str, str]:
    """Put the demo model in the catalog if absent; make the local API key once (as the operator),
    and the first admin user where there is none (its password, shown once; else "").
    `tend` keeps the processes between tries. The catalog takes the demo's plain source while the
    mirror is still verifying its import (the scheduler places it once the mirror holds it)."""
    nc = await connect(nats_url, "llmgw-up", creds=str(creds))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # the router keeps the audit trail before it answers people's endpoints: asked
                # first, the demo's put is on the trail (else it may come before the trail is kept)
                await call(nc, people.USER_LIST, Empty())
                if demo:
                    try:
                        await call(nc, catalog.MODEL_GET, ModelRef(name=demo.model.name))
                    except NotFound:
                        await call(nc, catalog.MODEL_PUT, ModelPut(model=demo.model, revision=0, by="llmgw up"))
                key_file = home / "up" / "api-key"
                if not key_file.exists():
                    created = await call(nc, router.KEY_CREATE, KeyCreate(name="llmgw-up", admin=True))
                    key_file.parent.mkdir(parents=True, exist_ok=True)
                    tmp = key_file.with_suffix(".part")
                    tmp.write_text(created.key + "\n")
                    tmp.chmod(0o600)
                    tmp.replace(key_file)
                return key_file.read_text().strip(), await _first_admin(nc)
            except BusError:
                if time.monotonic() > deadline:
                    raise
                tend()
                await asyncio.sleep(0.3)
    finally:
        await nc.close()


def _wait_listening(url: str, tend: Callable[[], None], timeout: float = 60) -> None:
    """Return once the router answers HTTP at `url` (any status); `tend` keeps the processes meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            tend()
            time.sleep(0.1)
    raise TimeoutError(f"the router did not listen on {url} within {timeout:g} s")


def _say_up(
    home: Path, state: UpState, access: tuple[str, str], operator: Path, model: str, ports: dict[str, int]
) -> None:
    """Write <home>/up/up.json (where it is) and print how to use it (`access`: the API key, and
    the first admin user's password where it was just made)."""
    key, password = access
    sd = write_up_state(home, state, ports)
    base, nats_url = state.base_url, state.nats_url
    print(f"llmgw is up (data in {home})", flush=True)
    print(f"  OpenAI base URL: {base}", flush=True)
    print(f"  API key:         {key}", flush=True)
    print(f"  web console:     {base.removesuffix('/v1')}/console (sign in with the API key, an admin's)", flush=True)
    print(f"  NATS:            {nats_url}", flush=True)
    if state.join_url:
        print(f"  machines join:   `llmgw node invite NAME` here, then the command it prints there ({state.join_url})")
    print(f"  operator creds:  {operator}", flush=True)
    if password:
        print(f"  console user:    admin, password {password} (shown this once; `llmgw ctl user` makes more)")
    print(f"  operate it:      llmgw ctl --data-dir {home} models (or LLMGW_HOME={home})", flush=True)
    shown = ", ".join(f"{name} {port}" for name, port in ports.items())
    print(f"  metrics:         /metrics on 127.0.0.1 ports {shown}; Prometheus file_sd: {sd}", flush=True)
    # SmolLM2 names Paris given a system message; without one it rambles.
    system = '{"role": "system", "content": "You are a helpful assistant."}'
    question = (
        f'"messages": [{system}, {{"role": "user", "content": "What is the capital of France?"}}], "temperature": 0'
    )
    print(
        f"  curl {base}/chat/completions -H 'Authorization: Bearer {key}' "
        "-H 'Content-Type: application/json' "
        f'-d \'{{"model": "{model}", {question}}}\'',
        flush=True,
    )


class _NoJoins:
    """On the loopback no other machine can join."""

    url = fingerprint = ""

    def stop(self) -> None:
        """Nothing to stop."""


def _joins(
    home: Path, opts: UpOptions, server: Kept, port: int, node: str, cluster: Cluster | None
) -> JoinServer | _NoJoins:
    """Answer joins on `opts.listen` (off the loopback): a machine let in gets its identity and
    engine secret, and NATS reloads its authorization (SIGHUP) to take it in. A machine at one of
    the HA addresses joins as a member (`cluster.MemberPass`)."""
    if opts.listen == "127.0.0.1":
        return _NoJoins()
    members = [opts.listen, *opts.ha]

    def admit(joined: str, address: str) -> MemberPass | None:
        ensure_identities(home / "creds", [("agent", joined)])
        _, creds, identities = _access(home, node, opts.listen, port, cluster)  # the new agent too
        server.proc.send_signal(signal.SIGHUP)
        if cluster is None or not take_member(home, joined, address, members):
            return None
        ca, cert, key = issue_route_certificate(home, joined, address)
        return MemberPass(
            members=members,
            ca_pem=ca,
            cert_pem=cert,
            key_pem=key,
            identities=public_identities(identities),
            router_seed=read_identity(creds["router"]).seed,
            engine_secret=engine_secret_file(home / "creds").read_text(),
        )

    url = members_url(members, port) if cluster else f"nats://{opts.listen}:{port}"
    joins = JoinServer(home, opts.listen, JOIN_PORT, url, admit)
    joins.identities = lambda: public_identities([identity for identity, _, _ in _identities(home, node)])
    return joins.start()


def _service_args(opts: UpOptions, home: Path, node: str, gateway: int, mirror_toml: Path) -> dict[str, list[str]]:
    """Each service's own flags under `up`."""
    # One agent on this host: nothing to keep its bandwidth measurement apart from.
    agent_args = [
        "--membw-delay-max-s",
        "3",
        "--engine-secret",
        str(engine_secret_file(home / "creds", node)),
        "--scheduler-key",  # it acts only on starts and stops the scheduler signed
        str(scheduler_key_file(home / "creds")),
    ]
    if opts.listen != "127.0.0.1":  # its engines are reached by routers on other machines
        agent_args += ["--address", opts.listen]
    router = ["--listen-fd", str(gateway), "--drain-s", str(opts.drain_s)]  # the socket up holds
    router += ["--engine-secret", str(engine_secret_file(home / "creds"))]
    args = {
        "router": router,
        "agent": agent_args,
        "scheduler": ["--drain-s", "2"],
        "mirror": ["--config", str(mirror_toml)],
    }
    if opts.ha:  # every bucket and stream in three copies; the gateway on this machine's address too
        args = {name: [*args.get(name, []), "--storage-replicas", str(HA_SIZE)] for name in SERVICES}
    return args


def _gateway(opts: UpOptions) -> socket.socket:
    """The OpenAI endpoint's socket, which up holds and its routers accept on (on every address
    with HA machines); a taken port said in one sentence."""
    host = "0.0.0.0" if opts.ha else "127.0.0.1"
    try:
        return listening(host, opts.http_port)
    except OSError as exc:
        raise BusError(
            f"the HTTP port {host}:{opts.http_port} is taken ({exc.strerror}); give another with --http-port"
        ) from None


def _claim(home: Path) -> TextIO | None:
    """The data directory's folders made and its lock taken (held while the file stays open);
    None: another `up` holds it."""
    for d in ("logs", "nats", "mirror", "up", "creds"):
        (home / d).mkdir(parents=True, exist_ok=True)
    lock = open(home / "up" / "lock", "w")  # held open until `up` ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def _demo(opts: UpOptions, home: Path) -> tuple[Demo | None, Path]:
    """The demo model (said where it comes from), and the mirror's config importing it (a list,
    which only a config file gives)."""
    demo = choose_demo(home) if opts.demo else None
    if demo and demo.said:
        print(demo.said, flush=True)
    mirror_toml = home / "up" / "mirror.toml"
    mirror_toml.write_text(mirror_config(demo.imports if demo else []))
    return demo, mirror_toml


def up(opts: UpOptions) -> int:
    """Run llmgw until SIGINT or SIGTERM, starting again what dies; then stop everything started,
    engines included, the router drained first."""
    home = opts.home()
    lock = _claim(home)
    if lock is None:
        print(f"llmgw up: another `llmgw up` is running over {home}", file=sys.stderr)
        return 1
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kept: dict[str, Kept] = {}
    watches: list[StoreKeeper | Rollout] = []
    joins: JoinServer | _NoJoins = _NoJoins()
    rollout = Rollout(home)

    def tend() -> None:
        if stopping:
            raise _Stopped
        for process in [*kept.values(), *watches]:
            process.tend(time.monotonic())

    try:
        demo, mirror_toml = _demo(opts, home)
        node = BusConfig().node_name()
        cluster = first_member(home, node, opts.listen, opts.ha)
        conf, creds, _ = _access(home, node, opts.listen, opts.nats_port, cluster)
        nats = spawn_nats(home, opts.nats_port, conf, opts.listen)
        kept["nats-server"] = Kept(
            "nats-server",
            lambda: spawn_nats(home, nats.port, conf, opts.listen).process,  # the same port: clients reconnect to it
            home / "nats" / "nats-server.log",
            opts.backoff,
            running=nats.process,
        )
        watches.append(StoreKeeper(kept["nats-server"], home / "nats"))
        gateway = _gateway(opts)
        http_port = gateway.getsockname()[1]
        base = f"http://127.0.0.1:{http_port}/v1"
        joins = _joins(home, opts, kept["nats-server"], nats.port, node, cluster)
        state = UpState(
            base_url=base, nats_url=nats.url, pid=os.getpid(), join_url=joins.url, join_fingerprint=joins.fingerprint
        )
        ports = admin_ports(list(SERVICES))
        write_up_state(home, state, ports)  # `llmgw node invite` finds it before the services start
        wait_members(home, opts.ha, tend)
        extra = _service_args(opts, home, node, gateway.fileno(), mirror_toml)
        for name in SERVICES:
            bus = (nats.url, creds[f"agent-{node}" if name == "agent" else name])

            def start(name=name, bus=bus) -> subprocess.Popen:  # its port and release as they are then
                port = rollout.port(name, ports[name])
                return spawn_service(name, home, bus, port, extra.get(name, []), rollout.python(name))

            kept[name] = Kept(name, start, home / "logs" / f"{name}.log", opts.backoff)
        rollout.keep(kept, lambda: write_up_state(home, state, rollout.ports))
        watches.append(rollout)
        key, password = asyncio.run(_setup(nats.url, home, demo, creds["ctl"], tend))
        _wait_listening(f"{base}/models", tend)
        _say_up(home, state, (key, password), creds["ctl"], demo.model.name if demo else "<model>", ports)
        while True:
            tend()
            time.sleep(0.1)
    except _Stopped:
        return 0
    except (BusError, TimeoutError, HaError) as exc:
        print(f"llmgw up: it did not start: {exc}; the services' logs are in {home / 'logs'}", file=sys.stderr)
        return 1
    finally:
        print("llmgw up: stopping", flush=True)
        joins.stop()
        rollout.stop()
        stop_in_order(kept, opts.drain_s)
        print("llmgw up: stopped", flush=True)
