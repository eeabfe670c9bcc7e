"""The health probe when the router itself is out of file descriptors (issue 31: a flood of
connections left the router none, its probe failed with `Too many open files`, and the model's
only replica was taken out of rotation). The descriptors are really exhausted here, in this
process, against a real HTTP server answering /health."""

import contextlib
import os
import resource
import types

import aiohttp
from aiohttp import web

from llmgw.proto import ReplicaState
from llmgw.router.config import RouterConfig
from llmgw.router.routing.balance import Balancer
from llmgw.router.routing.health import Health


@contextlib.contextmanager
def descriptors_spent():
    """Every descriptor the process may open, open (the soft limit lowered to a few past those in
    use, then filled), until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_probe_the_router_could_not_send_for_want_of_descriptors_leaves_the_replica_in():
    app = web.Application()
    app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    replica = ReplicaState(id="r1", model="m", profile="cpu", node="n", state="ready", url=f"http://127.0.0.1:{port}")
    directory = types.SimpleNamespace(replicas=types.SimpleNamespace(items={"r1": replica}))
    balancer = Balancer()
    async with aiohttp.ClientSession() as client:
        health = Health(directory, balancer, client, RouterConfig())
        with descriptors_spent():
            await health._probe(replica)
        assert "r1" not in balancer.strikes and not health.outage("r1").out
        await health._probe(replica)  # with descriptors again, the engine answers: still in
        assert "r1" not in balancer.strikes and not health.outage("r1").out
        replica.url = "http://127.0.0.1:1"  # and one that really fails its probe goes out
        await health._probe(replica)
        assert balancer.strikes["r1"] == 1 and health.outage("r1").out
    await runner.cleanup()
