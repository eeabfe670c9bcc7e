"""The agent as it runs: engines supervised (a real llama-server, and a vLLM stand-in), cards and
ports handed out, weights fetched once, resumed, checked, and refused when wrong.

Cards come from FakeNvml, a stand-in for pynvml (no GPU here); vLLM is tests/standins/
vllm_standin.py, a stand-in executable that speaks its health endpoint and records its start.
"""

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from llmgw.agent import usage
from llmgw.agent.cache import FetchError, WeightsCache
from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import BusError, Signer, call, new_fleet_secret, node_secret, read_identity, write_secret
from llmgw.ctl.tables import replicas_table
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import (
    FileInfo,
    FileRef,
    Model,
    Profile,
    ReplicaList,
    ReplicaReport,
    ReplicaSpec,
    ReplicaStart,
    ReplicaState,
    ReplicaStop,
    Worker,
    WorkerStart,
)
from llmgw.proto import agent as agent_api
from services.agent.tests.fake_nvml import FakeCard, FakeNvml

STANDIN = Path(__file__).parent / "standins" / "vllm_standin.py"
SOURCE = "test/tiny/m.gguf"


@pytest.fixture
async def node(serve, nc, tmp_path):
    """A mirror holding a tiny model, and an agent 'a' whose cards are two fake H100s."""
    write_random_llama(tmp_path / "mirror" / SOURCE)
    mirror = await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    vllm = tmp_path / "vllm"  # the stand-in under this interpreter, which has its zmq and msgspec
    vllm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    vllm.chmod(0o755)
    write_secret(tmp_path / "engine-a.secret", node_secret(new_fleet_secret(), "a"))
    config = AgentConfig(
        node="a",
        engine_secret=str(tmp_path / "engine-a.secret"),
        data_dir=str(tmp_path / "a"),
        heartbeat_s=60,
        vllm=str(vllm),
        membw_delay_max_s=3600,
        ports="21000-21099",
    )
    agent = Agent(config)
    agent.facts.nvml = FakeNvml([FakeCard(), FakeCard()])
    await serve(agent, config)
    return agent, mirror


async def start(nc, rid, model, profile, gpus=()):
    replica = ReplicaSpec(id=rid, model=model.name, profile=profile.name, node="a", gpus=list(gpus))
    return await call(
        nc, agent_api.REPLICA_START, ReplicaStart(replica=replica, model=model, profile=profile), node="a"
    )


async def until(agent, rid, *states, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = agent.replicas.runs[rid].report
        if report.state in states:
            return report
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica {rid} stayed {agent.replicas.runs[rid].report.state}")


async def test_a_vllm_stand_in_gets_its_cards_tensor_parallel_and_kv_events(node, nc, tmp_path, monkeypatch):
    agent, _ = node
    monkeypatch.setenv("VLLM_STANDIN_RECORD", str(tmp_path / "started.json"))
    model = Model(name="big", source=SOURCE, context=8192)
    await start(nc, "v1", model, Profile(name="gpu", engine="vllm", gpus=2, tensor_parallel=2, kv_events=True))
    ready = await until(agent, "v1", "ready", "failed")
    assert ready.state == "ready", ready.error
    assert ready.kv_events == f"tcp://127.0.0.1:{int(ready.url.rsplit(':', 1)[1]) + 1}"  # the port after its own
    started = json.loads((tmp_path / "started.json").read_text())
    argv = started["argv"]
    assert argv[0] == "serve" and argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--max-model-len") + 1] == "8192" and "--kv-events-config" in argv
    assert started["env"] == {"CUDA_VISIBLE_DEVICES": "GPU-0000,GPU-0001", "PYTHONHASHSEED": "0"}
    assert 21000 <= int(argv[argv.index("--port") + 1]) <= 21099


async def test_a_profile_asking_for_cards_the_node_lacks_fails_saying_so_and_others_carry_on(node, nc):
    agent, _ = node
    model = Model(name="m", source=SOURCE, context=512)
    await start(nc, "g4", model, Profile(name="gpu", engine="vllm", gpus=4))
    failed = await until(agent, "g4", "failed")
    assert "needs 4 free cards of one class; this node has 2 h100-80g free of 2" in failed.error
    await start(nc, "c1", model, Profile(name="cpu", slots=1))
    assert (await until(agent, "c1", "ready", "failed")).state == "ready"


async def test_the_cards_the_scheduler_chose_are_the_ones_the_engine_gets(node, nc, tmp_path, monkeypatch):
    agent, _ = node
    monkeypatch.setenv("VLLM_STANDIN_RECORD", str(tmp_path / "started.json"))
    model = Model(name="m", source=SOURCE, context=512)
    await start(nc, "s1", model, Profile(name="gpu", engine="vllm", gpus=1), gpus=["GPU-0001"])
    assert (await until(agent, "s1", "ready", "failed")).state == "ready"
    assert json.loads((tmp_path / "started.json").read_text())["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-0001"
    await start(nc, "s2", model, Profile(name="gpu", engine="vllm", gpus=1), gpus=["GPU-0001"])
    failed = await until(agent, "s2", "failed")
    assert "the cards GPU-0001 are not all here and free (free here: GPU-0000)" in failed.error


async def test_an_engine_that_dies_is_reported_failed_with_its_status_and_last_lines(node, nc):
    agent, _ = node
    await start(nc, "k1", Model(name="m", source=SOURCE, context=512), Profile(slots=1))
    await until(agent, "k1", "ready")
    os.kill(agent.replicas.runs["k1"].child.pid, signal.SIGKILL)
    failed = await until(agent, "k1", "failed")
    assert failed.error.startswith("engine exited with status -9") and failed.log_tail
    assert f"(its whole log: {agent.supervisor.logs / 'k1'}.log on node a)" in failed.error


async def test_an_engine_that_fails_at_start_says_what_it_printed_and_its_log_stays(node, nc):
    """A setting llama-server refuses: before, the report said only "exited at start with
    status 1", and the model's reason backed off with no word of why."""
    agent, _ = node
    await start(
        nc, "c1", Model(name="m", source=SOURCE, context=512), Profile(slots=1, args=["--cache-type-k", "bogus"])
    )
    failed = await until(agent, "c1", "failed")
    assert failed.error.startswith("engine exited at start with status 1; it printed: "), failed.error
    assert "Unsupported cache type: bogus" in failed.error and "its whole log: " in failed.error
    assert "Unsupported cache type" in (agent.supervisor.logs / "c1.log").read_text()


async def test_two_replicas_never_share_a_port_and_a_stop_frees_it(node, nc):
    agent, _ = node
    model = Model(name="m", source=SOURCE, context=512)
    await start(nc, "p1", model, Profile(slots=1))
    await start(nc, "p2", model, Profile(slots=1))
    one, two = await until(agent, "p1", "ready"), await until(agent, "p2", "ready")
    assert one.url != two.url
    assert agent.weights.fetches == 1  # one model, fetched once for both
    stopped = await call(nc, agent_api.REPLICA_STOP, ReplicaStop(id="p1"), node="a")
    assert stopped.state == "stopped" and "p1" not in agent.replicas.runs


async def test_the_engines_key_never_leaves_the_node_in_a_report_an_event_a_log_or_its_last_lines(
    node, nc, tmp_path, monkeypatch, capfd
):
    agent, _ = node
    key = agent.replicas.keys.key("a", "x1")  # worked out from node a's secret, as the router does from the fleet's
    monkeypatch.setenv("VLLM_STANDIN_EXIT", "1")  # it prints its arguments (the key among them), serves, dies
    events = await nc.subscribe(agent_api.REPLICA_CHANGED.all)
    reply = await start(nc, "x1", Model(name="m", source=SOURCE), Profile(name="gpu", engine="vllm", gpus=1))
    failed = await until(agent, "x1", "failed")
    assert failed.error.startswith("engine exited with status 1")
    assert any(line.startswith("non-default args:") and "***" in line for line in failed.log_tail)
    said = [reply, failed, *agent.replicas.reports()]
    assert all(isinstance(r, ReplicaReport) and key not in msgspec.json.encode(r).decode() for r in said)
    published = []
    while True:
        try:
            published.append((await events.next_msg(timeout=0.5)).data.decode())
        except TimeoutError:
            break
    assert len(published) >= 3 and all(key not in data for data in published)  # fetching, starting, ready, failed
    assert key not in (tmp_path / "a" / "agent" / "logs" / "x1.log").read_text()
    out, err = capfd.readouterr()
    assert "starting engine" in out + err and key not in out + err


async def test_a_direct_start_carrying_a_log_file_or_ld_preload_is_refused_and_starts_nothing(node, nc, tmp_path):
    agent, _ = node
    model, written = Model(name="m", source=SOURCE, context=512), tmp_path / "written-by-the-engine.log"
    with pytest.raises(BusError, match="replica f1: argument '--log-file' is refused: it names a file"):
        await start(nc, "f1", model, Profile(slots=1, args=["--log-file", str(written)]))
    with pytest.raises(BusError, match="replica f2: environment variable 'LD_PRELOAD' is refused"):
        await start(nc, "f2", model, Profile(slots=1, env={"LD_PRELOAD": str(tmp_path / "evil.so")}))
    await asyncio.sleep(0.5)
    assert agent.replicas.runs == {} and agent.supervisor.children == {} and not written.exists()


async def test_an_allowed_flag_reaches_the_engine_and_a_nodes_opt_in_counts_on_that_node_only(
    node, serve, nc, tmp_path, monkeypatch
):
    agent, _ = node  # node 'a' opted into nothing
    monkeypatch.setenv("VLLM_STANDIN_RECORD", str(tmp_path / "started.json"))
    model = Model(name="m", source=SOURCE, context=512)
    tuned = Profile(name="gpu", engine="vllm", gpus=1, args=["--enforce-eager"])
    lora = Profile(name="gpu", engine="vllm", gpus=1, args=["--enforce-eager", "--enable-lora"])
    await start(nc, "t1", model, tuned)
    assert (await until(agent, "t1", "ready", "failed")).state == "ready"
    assert json.loads((tmp_path / "started.json").read_text())["argv"][-1] == "--enforce-eager"
    with pytest.raises(BusError, match="replica t2: argument '--enable-lora' is refused"):
        await start(nc, "t2", model, lora)
    config = AgentConfig(
        node="b",
        data_dir=str(tmp_path / "b"),
        heartbeat_s=60,
        vllm=str(tmp_path / "vllm"),
        membw_delay_max_s=3600,
        ports="21200-21299",
        engine_args_allowed=["--enable-lora"],
    )
    b = Agent(config)
    b.facts.nvml = FakeNvml([FakeCard()])
    await serve(b, config)
    spec = ReplicaSpec(id="t3", model="m", profile="gpu", node="b")
    await call(nc, agent_api.REPLICA_START, ReplicaStart(replica=spec, model=model, profile=lora), node="b")
    assert (await until(b, "t3", "ready", "failed")).state == "ready"
    assert json.loads((tmp_path / "started.json").read_text())["argv"][-2:] == ["--enforce-eager", "--enable-lora"]


@pytest.fixture
async def held(serve, tmp_path):
    """A mirror holding one file, and what its stat says of it."""
    path = write_random_llama(tmp_path / "mirror" / SOURCE, TinyLlama(embedding=256, layers=4, feed_forward=1024))
    mirror = await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    info = await mirror.stat(FileRef(source=SOURCE))
    return path, info


async def test_a_fetch_broken_off_resumes_where_it_stopped(held, tmp_path):
    path, info = held
    seen = []
    async with httpx.AsyncClient(event_hooks={"request": [lambda r: _append(seen, r)]}) as http:
        cache = WeightsCache(tmp_path / "cache", http)
        dest = cache.path_for(info)
        dest.parent.mkdir(parents=True)
        half = path.read_bytes()[: info.size // 2]
        dest.with_name(f".{dest.name}.part").write_bytes(half)
        got = await cache.fetch(info)
    assert got.read_bytes() == path.read_bytes()
    assert seen == [f"bytes={len(half)}-"]


async def _append(seen, request):
    seen.append(request.headers.get("range"))


async def test_two_replicas_of_one_model_fetch_it_once(held, tmp_path):
    _, info = held
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        paths = await asyncio.gather(*(cache.fetch(info) for _ in range(4)))
    assert len(set(paths)) == 1 and cache.fetches == 1


async def test_a_file_whose_hash_does_not_match_is_refused_and_nothing_partial_stays(held, tmp_path):
    _, info = held
    lying = FileInfo(source=info.source, size=info.size, sha256="0" * 64, url=info.url)
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        with pytest.raises(FetchError, match=f"is not the mirror's {'0' * 64}; not used"):
            await cache.fetch(lying)
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


async def test_a_full_disk_while_fetching_fails_with_that_reason_and_removes_the_partial_file(held, tmp_path):
    _, info = held
    async with httpx.AsyncClient() as http:
        cache = WeightsCache(tmp_path / "cache", http)
        dest = cache.path_for(info)
        dest.parent.mkdir(parents=True)
        dest.with_name(f".{dest.name}.part").symlink_to("/dev/full")  # every write: ENOSPC, from the kernel
        with pytest.raises(FetchError, match="is full while fetching"):
            await cache.fetch(info)
    assert not dest.with_name(f".{dest.name}.part").exists() and not dest.exists()


def _agent_command(nats, data_dir):
    return [
        sys.executable,
        "-m",
        "llmgw.ctl",
        "service",
        "agent",
        "--nats-url",
        nats.url,
        "--creds",
        nats.creds("agent", "a"),
        "--admin-port",
        "0",
        "--node",
        "a",
        "--data-dir",
        str(data_dir),
        "--membw-delay-max-s",
        "3600",
        "--heartbeat-s",
        "0.3",
        "--ports",
        "21100-21199",
        "--scheduler-key",  # with credentials, it acts only on what the scheduler signed
        read_identity(nats.creds("scheduler")).public,
    ]


async def _beat_reporting(nc, rid, timeout=60):
    """The first heartbeat of node 'a' that reports `rid` ready."""
    from llmgw.proto import Heartbeat

    sub = await nc.subscribe(agent_api.HEARTBEAT.subject("a"))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                beat = msgspec.json.decode((await sub.next_msg(timeout=1)).data, type=Heartbeat)
            except TimeoutError:
                continue
            if any(r.id == rid and r.state == "ready" for r in beat.replicas):
                return beat
        raise AssertionError(f"no heartbeat reported {rid} ready")
    finally:
        await sub.unsubscribe()


def _engines(tmp_path):
    """The llama-servers running on this test's weights (whoever their parent)."""
    import psutil

    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if "llama-server" in (p.info["name"] or "") and str(tmp_path) in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


async def test_an_agent_killed_hard_and_restarted_adopts_its_engine_no_duplicate_no_orphan(
    serve, nc, nats_server, tmp_path
):
    import subprocess

    import psutil

    write_random_llama(tmp_path / "mirror" / SOURCE)
    await serve(Mirror(MirrorConfig(root=str(tmp_path / "mirror"))), MirrorConfig())
    cmd = _agent_command(nats_server, tmp_path / "a")
    model, profile = Model(name="m", source=SOURCE, context=512), Profile(slots=1)
    asked = ReplicaStart(
        replica=ReplicaSpec(id="h1", model="m", profile=profile.name, node="a"), model=model, profile=profile
    )
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    signer = Signer.from_creds(nats_server.creds("scheduler"))  # the harness asks as the scheduler would
    again = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                await call(nc, agent_api.REPLICA_START, asked, node="a", signer=signer)
                break
            except Exception:
                assert time.monotonic() < deadline, "the agent never answered"
                await asyncio.sleep(0.3)
        url = next(r.url for r in (await _beat_reporting(nc, "h1")).replicas if r.id == "h1")
        [engine] = _engines(tmp_path)
        agent.kill()
        agent.wait()
        async with httpx.AsyncClient() as http:
            for _ in range(5):  # it serves on while no agent runs
                assert (await http.get(f"{url}/health", timeout=5)).status_code == 200
                await asyncio.sleep(0.2)
        again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        beat = await _beat_reporting(nc, "h1")
        adopted = next(r for r in beat.replicas if r.id == "h1")
        assert adopted.url == url and [p.pid for p in _engines(tmp_path)] == [engine.pid]  # the same one, no other
        report = await call(nc, agent_api.REPLICA_START, asked, node="a", signer=signer)  # never started twice
        assert report.state == "ready" and [p.pid for p in _engines(tmp_path)] == [engine.pid]
        print(f"engine {engine.pid} served through its agent's death; the restarted agent adopted it at {url}")
        again.terminate()  # a clean stop stops its engines: nothing is orphaned
        again.wait(30)
        gone, alive = psutil.wait_procs([engine], timeout=20)
        assert alive == [] and _engines(tmp_path) == []
        assert list((tmp_path / "a" / "agent" / "engines").glob("*.json")) == []
    finally:
        for proc in (agent, again):
            if proc is not None and proc.poll() is None:
                proc.kill()
        for left in _engines(tmp_path):
            left.kill()


async def test_a_restarted_agent_ends_the_engines_it_cannot_vouch_for_and_forgets_dead_ones(node, nc, tmp_path):
    import psutil

    agent, _ = node
    model = Model(name="m", source=SOURCE, context=512)
    for rid in ("u1", "u2", "u3"):
        await start(nc, rid, model, Profile(slots=1))
    pids = {
        rid: (await until(agent, rid, "ready")) and agent.replicas.runs[rid].child.pid for rid in ("u1", "u2", "u3")
    }
    await agent.replicas.leave_all("killed")  # as a hard kill leaves them: serving, noted
    notes = tmp_path / "a" / "agent" / "engines"
    tampered = json.loads((notes / "u1.json").read_text())
    tampered["engine"]["argv"][-1] = "another-model"  # u1: not the command line noted
    (notes / "u1.json").write_text(json.dumps(tampered))
    os.kill(pids["u2"], signal.SIGSTOP)  # u2: frozen, no health check answered
    os.killpg(pids["u3"], signal.SIGKILL)  # u3: died while no agent ran
    again = Agent(msgspec.structs.replace(agent.config, stop_grace_s=1.0))
    left, ended = await again.supervisor.prepare()
    assert sorted(e.name for e in left) == ["u1", "u2"] and ended == []
    said = {e.name: await again.replicas.adopt(e) for e in left}
    url = agent.replicas.runs["u2"].report.url
    assert said == {
        "u1": "ended: its command line is not the one noted",
        "u2": f"ended: it does not answer its health check at {url}",
    }
    await asyncio.sleep(0.5)
    alive = [rid for rid, pid in pids.items() if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert alive == [] and again.replicas.runs == {} and list(notes.glob("*.json")) == []


async def test_engines_carry_on_while_nats_is_away_and_the_agent_reports_them_when_it_is_back(
    node, nc, nats_server, tmp_path
):
    from llmgw.bus import connect, start_nats_server
    from llmgw.proto import Heartbeat

    agent, _ = node
    agent.config.heartbeat_s = 0.3
    await start(nc, "n1", Model(name="m", source=SOURCE, context=512), Profile(slots=1))
    await until(agent, "n1", "ready")
    pid = agent.replicas.runs["n1"].child.pid
    nats_server.stop()
    await asyncio.sleep(1.5)
    assert agent.replicas.runs["n1"].child.proc.returncode is None  # the engine does not care
    back = start_nats_server(tmp_path / "nats", port=nats_server.port)
    nats_server.process = back.process  # stopped by the fixture, after the agent
    if True:
        watcher = await connect(back.url, "watcher")
        sub = await watcher.subscribe(agent_api.HEARTBEAT.subject("a"))
        beat = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=1)
            except Exception:
                continue
            beat = msgspec.json.decode(msg.data, type=Heartbeat)
            break
        assert beat is not None, "the agent never came back"
        assert [(r.id, r.state) for r in beat.replicas] == [("n1", "ready")]
        assert agent.replicas.runs["n1"].child.pid == pid and SOURCE in beat.weights
        await watcher.close()


async def test_a_worker_asked_of_the_wrong_node_or_of_a_node_without_rpc_is_refused_saying_why(node, nc):
    agent, _ = node
    model, profile = Model(name="m", source=SOURCE, context=512), Profile(name="rpc", nodes=2)
    elsewhere = ReplicaSpec(id="w1", model="m", profile="rpc", node="b", workers=[Worker(node="c")])
    with pytest.raises(BusError, match="replica w1 has no worker on node 'a' \\(its workers: c\\)"):
        await call(nc, agent_api.WORKER_START, WorkerStart(replica=elsewhere, model=model, profile=profile), node="a")
    agent.llamacpp.rpc_server = "/nonexistent/ggml-rpc-server"
    here = msgspec.structs.replace(elsewhere, workers=[Worker(node="a")])
    with pytest.raises(BusError, match="has no llama.cpp RPC worker at /nonexistent/ggml-rpc-server"):
        await call(nc, agent_api.WORKER_START, WorkerStart(replica=here, model=model, profile=profile), node="a")
    assert agent.workers.starts == {}  # nothing left half-started


async def test_a_worker_that_dies_at_start_says_so_with_its_last_words(node, nc, tmp_path):
    agent, _ = node
    dying = tmp_path / "ggml-rpc-server"
    dying.write_text("#!/bin/sh\necho 'cannot bind: address in use'\nexit 3\n")
    dying.chmod(0o755)
    agent.llamacpp.rpc_server = str(dying)
    replica = ReplicaSpec(id="w2", model="m", profile="rpc", node="b", workers=[Worker(node="a")])
    with pytest.raises(BusError, match="exited at start with status 3; it printed: cannot bind: address in use"):
        await call(
            nc,
            agent_api.WORKER_START,
            WorkerStart(replica=replica, model=Model(name="m", source=SOURCE), profile=Profile(name="rpc", nodes=2)),
            node="a",
        )
    assert agent.workers.starts == {}


async def test_a_running_engine_reports_its_measured_memory_and_on_cards_what_nvml_says_it_holds(node, nc, tmp_path):
    agent, _ = node
    model = Model(name="m", source=SOURCE, context=512)
    await start(nc, "c1", model, Profile(name="cpu", slots=1))
    assert (await until(agent, "c1", "ready", "failed")).state == "ready"
    [cpu] = [r for r in agent._work().replicas if r.id == "c1"]  # what the next heartbeat carries
    rss = sum(p.memory_info().rss for p in usage.process_tree(agent.replicas.runs["c1"].child.pid)) // 2**20
    assert cpu.measured_mb > 0 and abs(cpu.measured_mb - rss) <= max(16, rss // 10)
    # On cards (a vLLM stand-in on a FakeNvml card, no GPU here): NVML's per-process memory is added.
    await start(nc, "g1", model, Profile(name="gpu", engine="vllm", gpus=1), gpus=["GPU-0000"])
    assert (await until(agent, "g1", "ready", "failed")).state == "ready"
    agent.facts.nvml.cards[0].processes = [(agent.replicas.runs["g1"].child.pid, 700)]
    [gpu] = [r for r in agent._work().replicas if r.id == "g1"]
    assert gpu.measured_mb >= 700 and [r.measured_mb for r in agent._work().replicas if r.id == "c1"][0] < 700
    ctl_rows = replicas_table(ReplicaList(replicas=[ReplicaState(**msgspec.to_builtins(cpu), estimate_mb=400)]))
    assert f"400/{cpu.measured_mb} " in ctl_rows.splitlines()[1]
