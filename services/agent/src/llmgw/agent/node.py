"""What this node is, said to the scheduler: its hardware and engines (NodeInfo), its memory
bandwidth measured now and then, registration, and a heartbeat with what it runs."""

from __future__ import annotations

import asyncio
import os
import platform
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from llmgw.agent.config import AgentConfig
from llmgw.agent.discovery import EngineProbe, cpu_flags, discover_cards, filesystems, load_nvml, os_release
from llmgw.bus import BusError, Context, LlamaCpp, call, meminfo_mb
from llmgw.membw import (
    Bandwidth,
    KeptBandwidth,
    load_bandwidth,
    load_calibration,
    measure,
    save_bandwidth,
)
from llmgw.proto import CpuCalibration, GpuInfo, Heartbeat, NodeInfo, ReplicaReport, agent, scheduler

__all__ = ["NodeFacts", "Work", "this_machine"]

_KEPT_BEST_S = 7 * 86400.0
"""A kept best figure older than this is not reported at a start: the machine is measured again."""


class Work(NamedTuple):
    """What the node does now, for its heartbeat."""

    replicas: list[ReplicaReport]
    weights: list[str]
    """Sources whose weights the cache holds."""
    workers: list[str]
    """Replicas whose RPC workers run here."""


def this_machine() -> str:
    """What a kept bandwidth figure is of: the host's name, its CPUs and its memory."""
    total, _ = meminfo_mb(Path("/proc/meminfo").read_text())
    return f"{socket.gethostname()}, {os.cpu_count()} CPUs, {total} MB"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class NodeFacts:
    """The node's facts, its registration and its heartbeats.

    `own_pids` gives the pids of this agent's children (their card memory is not foreign).
    """

    def __init__(self, config: AgentConfig, llamacpp: LlamaCpp, cache: Path, own_pids: Callable[[], set[int]]) -> None:
        self.config, self.llamacpp, self.cache, self.own_pids = config, llamacpp, cache, own_pids
        self.node = config.node_name()
        self.nvml = load_nvml()
        """pynvml, or a stand-in (tests)."""
        self.engines = EngineProbe({"llamacpp": llamacpp.server, "vllm": config.vllm})
        self.bandwidth: Bandwidth | None = None
        self.calibration: CpuCalibration | None = None
        self.registered = False
        self._said: set[str] = set()
        self._host = (cpu_flags(_read("/proc/cpuinfo")), os_release(_read("/etc/os-release")), platform.machine())
        self._ctx: Context | None = None

    def cards(self) -> list[GpuInfo]:
        """The cards here now."""
        return discover_cards(self.nvml).gpus

    def info(self) -> NodeInfo:
        """Everything the scheduler knows this node by, as it is now."""
        total, available = meminfo_mb(Path("/proc/meminfo").read_text())
        bw = self.bandwidth
        cards = discover_cards(self.nvml, self.own_pids())
        for problem in set(cards.problems) - self._said:  # no driver is said once, not every heartbeat
            self._said.add(problem)
            self._ctx.log.info("gpus", note=problem)
        flags, os_name, arch = self._host
        engines = self.engines.versions()
        if "llamacpp" in engines and self.llamacpp.has_rpc():  # the same build
            engines["llamacpp-rpc"] = engines["llamacpp"]
        return NodeInfo(
            node=self.node,
            hostname=socket.gethostname(),
            cpus=os.cpu_count() or 1,
            memory_total_mb=total,
            memory_available_mb=available,
            engines=engines,
            membw_all_gbs=bw.all_cores_gbs if bw else None,
            membw_one_gbs=bw.one_core_gbs if bw else None,
            cpu_calibration=self.calibration,
            gpus=cards.gpus,
            driver_version=cards.driver,
            cpu_flags=flags,
            os=os_name,
            arch=arch,
            filesystems=filesystems([self.cache]),
            labels=self.config.labels,
        )

    def start(self, ctx: Context, work: Callable[[], Work]) -> list[asyncio.Task]:
        """Heartbeats (registering first) and bandwidth measures, as tasks of their own."""
        self._ctx = ctx
        self.calibration = load_calibration(self.config.home())
        return [asyncio.create_task(self._heartbeats(work)), asyncio.create_task(self._measure_bandwidth())]

    async def _measure_bandwidth(self) -> None:
        """Measure after a random delay, then every hour, keeping the best figures seen (in the
        data directory too, for a week: an agent started again reports them at once, and
        measures when the hour since the last measurement is up)."""
        home, every = Path(self.config.home()), self.config.membw_every_s
        wait, best_at = random.uniform(0, self.config.membw_delay_max_s), 0.0
        kept = load_bandwidth(home, this_machine())
        if kept is not None and time.time() - kept.best_at < _KEPT_BEST_S:
            self.bandwidth, best_at = kept.best, kept.best_at
            wait += min(max(kept.measured_at + every - time.time(), 0.0), every)
        await asyncio.sleep(wait)
        while True:
            measured = await asyncio.to_thread(measure)
            if measured is None:
                self._ctx.log.warning("memory bandwidth not measured: too little free memory for an honest buffer")
            else:
                if self.bandwidth is None or measured.all_cores_gbs > self.bandwidth.all_cores_gbs:
                    best_one = max(measured.one_core_gbs, self.bandwidth.one_core_gbs if self.bandwidth else 0.0)
                    self.bandwidth = msgspec.structs.replace(
                        measured, one_core_gbs=min(best_one, measured.all_cores_gbs)
                    )
                    best_at = time.time()
                    self._ctx.log.info(
                        "memory bandwidth",
                        all_cores_gbs=self.bandwidth.all_cores_gbs,
                        one_core_gbs=self.bandwidth.one_core_gbs,
                    )
                await self._keep_bandwidth(home, best_at)
            await asyncio.sleep(every)

    async def _keep_bandwidth(self, home: Path, best_at: float) -> None:
        """Write the best figure to the data directory; a disk that refuses is said, and the
        measuring goes on."""
        kept = KeptBandwidth(best=self.bandwidth, best_at=best_at, measured_at=time.time(), machine=this_machine())
        try:
            await asyncio.to_thread(save_bandwidth, home, kept)
        except OSError as exc:
            self._ctx.log.warning("memory bandwidth not kept in the data directory", error=str(exc))

    async def _heartbeats(self, work: Callable[[], Work]) -> None:
        """Register (again after NATS or the scheduler went away), and heartbeat whatever happens."""
        ctx = self._ctx
        while True:
            try:
                info = self.info()
                if not self.registered:
                    try:
                        await call(ctx.nc, scheduler.NODE_REGISTER, info, node=self.node, timeout=5)
                        self.registered = True
                        ctx.log.info("registered", node=self.node)
                    except BusError as exc:  # the scheduler may not be up (yet): heartbeats go on
                        ctx.log.warning("registration failed, retrying", error=exc.message)
                now = work()
                beat = Heartbeat(
                    info=info,
                    replicas=now.replicas,
                    load1=os.getloadavg()[0],
                    sent=time.time(),
                    weights=now.weights,
                    workers=now.workers,
                )
                await ctx.nc.publish(agent.HEARTBEAT.subject(self.node), msgspec.json.encode(beat))
            except Exception as exc:  # NATS away: nats-py reconnects; register again when it is back
                self.registered = False
                ctx.log.warning("heartbeat not sent", error=str(exc))
            await asyncio.sleep(self.config.heartbeat_s)
