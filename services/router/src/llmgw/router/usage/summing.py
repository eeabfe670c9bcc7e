"""Summing the usage stream into slots (`usage.UsageBook.roll`) in a process of its own beside the
router, at idle priority: the router's loop and core serve requests alone.

Summed on the router's loop, a second of usage at 7,000 requests a second cost ~35 ms of it, and
the gateway's p99 at one connection went from 0.62 ms to 1.71 ms (`tests/bench/gateway.py`). The
process runs under `SCHED_IDLE` (the kernel gives it a core only when nothing else wants one) and
dies with the router; the router starts it again when it stops. It signs in as the router does.
"""

from __future__ import annotations

import asyncio
import os
import sys

import uvloop

from llmgw.bus import connect, die_with_parent, get_logger, load_config, setup_logging
from llmgw.router.config import RouterConfig
from llmgw.router.usage.book import UsageBook

__all__ = ["RESTART_S", "Summing", "main"]

RESTART_S = 5.0
"""How long the router waits before starting summing again after it stopped."""


def _idle_child() -> None:
    """For `preexec_fn`: die with the router, and run only on a core nothing else wants."""
    die_with_parent()
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class Summing:
    """The summing process, kept running while the router runs."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        """How many times it was started."""
        self._task: asyncio.Task | None = None
        self.log = get_logger("router")

    def argv(self) -> list[str]:
        """How it is started: the router's connection and usage settings, as flags."""
        c = self.config
        argv = [sys.executable, "-m", "llmgw.router.usage.summing", "--nats-url", c.nats_url]
        argv += ["--log-level", c.log_level, "--usage-days", str(c.usage_days), "--node", c.node_name()]
        for flag, value in (("--creds", c.creds), ("--tls-ca", c.tls_ca), ("--data-dir", c.data_dir)):
            if value:
                argv += [flag, value]
        return argv

    def start(self) -> None:
        """Start it, and again whenever it stops, until `stop`."""
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            self.proc = await asyncio.create_subprocess_exec(*self.argv(), preexec_fn=_idle_child)
            self.starts += 1
            status = await self.proc.wait()
            self.log.warning("usage summing stopped; starting it again", status=status, after_s=RESTART_S)
            await asyncio.sleep(RESTART_S)

    def stop(self) -> None:
        """Stop it (and stop starting it again)."""
        if self._task is not None:
            self._task.cancel()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()


async def _sum(config: RouterConfig) -> None:
    nc = await connect(config.nats_url, "router-summing", creds=config.creds, tls_ca=config.tls_ca)
    book = await UsageBook.open(nc, nc.jetstream(), config.usage_days)
    try:
        await asyncio.gather(*book.tasks)
    finally:
        book.stop()
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    """Sum the usage stream into slots until SIGTERM (the router starts this; not for people)."""
    config = load_config(RouterConfig, argv)
    setup_logging("router", config.node_name(), config.log_level)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_sum(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
