"""Outside providers through the real router: a stand-in provider (`tests/standins/
openai_provider.py`, ours: an OpenAI-compatible server holding each key to a limit, with a
revoked key, a slow first byte and a cut stream) answering a model the catalog lacks, and a
catalog model while its own replicas are not ready (the echo stand-in engine, once they are).
Requests spread over the keys; a key refused cools while the others carry on; the keys' own
limits are kept; with none left, a 503 names the provider."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import openai
import pytest

from llmgw.bus import BadRequest, call
from llmgw.proto import Empty, Limits, providers
from llmgw.proto import router as router_api
from llmgw.proto.providers import Provider, ProviderKey
from tests.test_guard import echo  # noqa: F401 (the fixture)
from tests.test_router import CPU, MODEL, engines, world  # noqa: F401 (the fixtures)

STANDIN = Path(__file__).parent / "standins" / "openai_provider.py"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def provider():
    """Start the stand-in with the given arguments; its base URL and its /stats."""
    started = []

    def start(*argv: str) -> tuple[str, str]:
        proc = subprocess.Popen([sys.executable, str(STANDIN), *argv], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        port = proc.stdout.readline().split()[-1]
        return f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/stats"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _keys(*names: str, **limits: int) -> list[ProviderKey]:
    return [ProviderKey(name=n, key=f"sk-{n}-secret", **limits) for n in names]


async def _put(world, nc, provider: Provider) -> None:  # noqa: F811
    await call(nc, providers.PROVIDER_PUT, provider)
    await world.until(lambda: world.router.proxy.outside(next(iter(provider.models))) is not None)


async def test_a_model_only_a_provider_answers_spreads_over_its_keys_and_keeps_them_secret(world, nc, provider):  # noqa: F811
    base, stats = provider("--key", "a:sk-a-secret:0", "--key", "b:sk-b-secret:0", "--key", "c:sk-c-secret:0")
    await _put(world, nc, Provider(name="acme", base_url=base, keys=_keys("a", "b", "c"), models={"mini": "gpt-x"}))
    client = await world.client()
    assert "mini" in [m.id for m in (await client.models.list()).data]
    for _ in range(9):
        answer = await client.chat.completions.with_raw_response.create(model="mini", messages=HI)
        said = answer.parse()
        assert said.choices[0].message.content == "[gpt-x] You said: hi" and said.model == "mini"
        assert answer.headers["x-llmgw-replica"] == "provider:acme"
    streamed = await client.chat.completions.create(model="mini", messages=HI, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices]) == "[gpt-x] You said: hi"
    assert httpx.get(stats).json() == {"a": 4, "b": 3, "c": 3}  # the least used key each time
    for _ in range(100):  # usage is counted as own use is: the usage stream, under the model asked
        log = (await call(nc, router_api.REQUEST_LOG, router_api.RequestLogAsk(model="mini"))).requests
        if len(log) == 10:
            break
        await asyncio.sleep(0.1)
    assert {(r.replica, r.status, r.prompt_tokens, r.completion_tokens) for r in log} == {("provider:acme", 200, 7, 9)}
    listed = await call(nc, providers.PROVIDER_LIST, Empty())
    assert {k.key for k in listed.providers[0].keys} == {"(hidden)"}
    kept = (await world.router.providers.table.kv.get("acme")).value.decode()
    assert "sk-a-secret" not in kept and "sealed.v1." in kept
    again = msgspec.structs.replace(listed.providers[0], by="ops")  # sent back as shown: the keys are kept
    await call(nc, providers.PROVIDER_PUT, again)
    assert (await client.chat.completions.create(model="mini", messages=HI)).choices[0].message.content
    moved = msgspec.structs.replace(again, base_url="http://127.0.0.1:9/v1")  # hidden keys are not sent elsewhere
    before = (await world.router.providers.table.kv.get("acme")).value
    with pytest.raises(BadRequest, match="key 'a' is new, or base_url is: give the key itself"):
        await call(nc, providers.PROVIDER_PUT, moved)
    assert (await world.router.providers.table.kv.get("acme")).value == before


async def test_a_key_that_cannot_be_opened_is_refused_at_put_and_holds_nothing_where_written_anyway(
    world,  # noqa: F811
    nc,
    provider,
):
    base, _ = provider("--key", "a:sk-a-secret:0")
    client = await world.client(limits=Limits(concurrent=1))  # a request left holding its place refuses the next
    for forged in ("sealed.v1.", "sealed.v1.abc", "sealed.v1.AAAA"):
        bad = Provider(name="acme", base_url=base, keys=[ProviderKey(name="a", key=forged)], models={"mini": "gpt-x"})
        with pytest.raises(BadRequest, match="key 'a' is a sealed value: give the key itself"):
            await call(nc, providers.PROVIDER_PUT, bad)
        # written into the bucket anyway (by hand, or by an earlier release): each request ends, let go
        await world.router.providers.table.kv.put("acme", msgspec.json.encode(bad))
        await world.until(lambda: world.router.proxy.outside("mini") is not None)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model="mini", messages=HI)
        assert refused.value.status_code == 503 and "provider 'acme'" in refused.value.message, refused.value
        await world.router.providers.table.kv.delete("acme")
        await world.until(lambda: world.router.proxy.outside("mini") is None)


async def test_a_key_refused_cools_while_the_others_carry_on_and_none_left_is_a_503_naming_the_provider(
    world,  # noqa: F811
    nc,
    provider,
):
    base, stats = provider("--key", "a:sk-a-secret:2", "--key", "c:sk-c-secret:2", "--window", "30")
    await _put(world, nc, Provider(name="acme", base_url=base, keys=_keys("a", "b", "c"), models={"mini": "gpt-x"}))
    client = await world.client()
    for _ in range(4):  # b is revoked: the request it was tried with goes with another key
        assert (await client.chat.completions.create(model="mini", messages=HI)).choices[0].message.content
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="mini", messages=HI)
    assert refused.value.status_code == 503 and "provider 'acme'" in refused.value.message
    assert int(refused.value.response.headers["retry-after"]) >= 1
    keys = (await call(nc, providers.PROVIDER_LIST, Empty())).keys
    assert keys["acme.b"].why.startswith("401") and keys["acme.b"].cooling_until > 0
    assert keys["acme.a"].why.startswith("429") and keys["acme.c"].why.startswith("429")
    assert httpx.get(stats).json() == {"a": 2, "c": 2}
    # removed by another router: its bucket entry goes, and so does this router's pool of it
    await world.router.providers.table.kv.delete("acme")
    await world.until(lambda: "acme" not in world.router.providers.table.items)
    assert (await call(nc, providers.PROVIDER_LIST, Empty())).keys == {}
    await _put(world, nc, Provider(name="acme", base_url=base, keys=_keys("a", "b", "c"), models={"mini": "gpt-x"}))
    keys = (await call(nc, providers.PROVIDER_LIST, Empty())).keys
    assert len(keys) == 3 and not any(k.cooling_until for k in keys.values()), keys  # a pool of its own


async def test_the_keys_own_limits_are_kept_without_asking_the_provider(world, nc, provider):  # noqa: F811
    base, stats = provider("--key", "a:sk-a-secret:0", "--key", "b:sk-b-secret:0")
    keys = _keys("a", "b", requests_per_minute=2)
    await _put(world, nc, Provider(name="acme", base_url=base, keys=keys, models={"mini": "gpt-x"}))
    client = await world.client()
    await world.until(lambda: time.time() % 60 < 50, timeout=15)  # one minute's window
    for _ in range(4):
        await client.chat.completions.create(model="mini", messages=HI)
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="mini", messages=HI)
    assert refused.value.status_code == 503 and "at its limit" in refused.value.message
    assert httpx.get(stats).json() == {"a": 2, "b": 2}  # the fifth never reached the provider


async def test_an_answer_slower_than_the_routers_health_rounds_is_waited_for(world, nc, provider):  # noqa: F811
    base, _ = provider("--key", "a:sk-a-secret:0")  # "slow": 3 s before its first byte
    await _put(world, nc, Provider(name="acme", base_url=base, keys=_keys("a"), models={"mini": "gpt-x"}))
    client = await world.client()
    slow = await client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "slow"}])
    assert slow.choices[0].message.content == "[gpt-x] You said: slow"  # a provider is never "out of rotation"


async def test_a_catalog_model_goes_outside_while_its_replicas_are_not_ready_and_back_when_they_are(
    world,  # noqa: F811
    nc,
    provider,
    echo,  # noqa: F811
):
    base, _ = provider("--key", "a:sk-a-secret:0")
    await world.model(MODEL)
    await _put(world, nc, Provider(name="acme", base_url=base, keys=_keys("a"), models={"m": "gpt-x"}))
    client = await world.client()
    outside = await client.chat.completions.create(model="m", messages=HI)
    assert outside.choices[0].message.content == "[gpt-x] You said: hi" and outside.model == "m"
    await world.replica(MODEL, CPU, url=echo[0])
    own = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    assert own.parse().choices[0].message.content == "You said: hi"
    assert not own.headers["x-llmgw-replica"].startswith("provider:")


async def test_a_model_the_provider_always_answers_uses_its_own_replicas_when_every_key_is_revoked(
    world,  # noqa: F811
    nc,
    provider,
    echo,  # noqa: F811
):
    base, _ = provider("--key", "a:sk-a-secret:0", "--revoked", "sk-b-secret")
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=echo[0])
    only = Provider(name="acme", base_url=base, keys=_keys("a", "b"), models={"m": "gpt-x"}, use="only")
    await _put(world, nc, only)
    client = await world.client()
    for _ in range(2):  # always the provider while it has a key
        said = await client.chat.completions.create(model="m", messages=HI)
        assert said.choices[0].message.content == "[gpt-x] You said: hi"
    revoked = msgspec.structs.replace(only, keys=_keys("b"))
    await call(nc, providers.PROVIDER_PUT, revoked)
    await world.until(lambda: world.router.proxy.outside("m").secrets == {"b": "sk-b-secret"})
    own = await client.chat.completions.create(model="m", messages=HI)
    assert own.choices[0].message.content == "You said: hi"  # its one key revoked: its own replica


async def test_a_slow_first_byte_a_cut_stream_a_renamed_model_and_wrong_settings_are_said(world, nc, provider):  # noqa: F811
    base, _ = provider("--key", "a:sk-a-secret:0")
    slow = Provider(name="acme", base_url=base, keys=_keys("a"), models={"mini": "gpt-x"}, timeout_s=1)
    await _put(world, nc, slow)
    client = await world.client()
    with pytest.raises(openai.APIStatusError) as late:
        await client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "slow"}], stream=True)
    assert (
        late.value.status_code == 503 and "provider 'acme' failed before answering (no first byte" in late.value.message
    )
    cut = await client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "cut"}], stream=True)
    with pytest.raises(openai.APIError):
        async for _ in cut:
            pass
    renamed, _ = provider("--key", "a:sk-a-secret:0", "--renamed", "gpt-old")
    await _put(world, nc, Provider(name="old", base_url=renamed, keys=_keys("a"), models={"legacy": "gpt-old"}))
    with pytest.raises(openai.APIStatusError) as unknown:
        await client.chat.completions.create(model="legacy", messages=HI)
    assert unknown.value.status_code == 502 and "does not know model 'gpt-old'" in unknown.value.message
    with pytest.raises(BadRequest, match="http:// or https://"):
        await call(nc, providers.PROVIDER_PUT, Provider(name="x", base_url="ftp://h/v1", keys=_keys("a"), models={}))
    with pytest.raises(BadRequest, match="called the same"):
        await call(nc, providers.PROVIDER_PUT, Provider(name="x", base_url=base, keys=_keys("a", "a"), models={}))
    hidden = [ProviderKey(name="new", key="(hidden)")]
    with pytest.raises(BadRequest, match="give the key itself"):
        await call(nc, providers.PROVIDER_PUT, Provider(name="x", base_url=base, keys=hidden, models={}))


async def test_ctl_puts_lists_and_removes_a_provider_reading_keys_from_the_environment(
    world,  # noqa: F811
    nats_server,
    provider,
):
    base, _ = provider("--key", "a:sk-a-secret:0")
    env = {**os.environ, "PROVIDER_KEY_A": "sk-a-secret"}
    ctl = lambda *w: asyncio.to_thread(_ctl, nats_server, env, *w)  # noqa: E731
    key = "a=env:PROVIDER_KEY_A,rpm=100"
    made = await ctl("provider", "put", "acme", "--base-url", base, "--key", key, "--model", "mini=gpt-x")
    assert made.returncode == 0 and "provider acme: 1 keys, mini→gpt-x (fallback)" in made.stderr, made.stderr
    assert "sk-a-secret" not in made.stdout + made.stderr
    client = await world.client()
    await world.until(lambda: world.router.proxy.outside("mini") is not None)
    for _ in range(3):  # a key counts its minute: one request and the list inside the same one
        minute = int(time.time() // 60)
        await client.chat.completions.create(model="mini", messages=HI)
        listed = await ctl("provider", "list")
        if int(time.time() // 60) == minute:
            break
    assert "acme" in listed.stdout and "100 rpm" in listed.stdout and "1 req" in listed.stdout
    assert "sk-a-secret" not in listed.stdout
    wrong = await ctl("provider", "put", "x", "--base-url", base, "--key", "a=s,rpm=x")
    assert wrong.returncode != 0 and "'rpm=x' is not rpm=N or tpm=N" in wrong.stderr
    unset = await ctl("provider", "put", "x", "--base-url", base, "--key", "a=env:NOPE")
    assert unset.returncode != 0 and "$NOPE is empty or not set" in unset.stderr
    assert (await ctl("provider", "remove", "acme")).returncode == 0
    await world.until(lambda: world.router.proxy.outside("mini") is None)


def _ctl(nats_server, env: dict, *words: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], capture_output=True, text=True, timeout=60, env=env)
