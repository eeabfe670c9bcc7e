"""Guardrails through the real router to a stand-in engine that echoes what it was sent
(`tests/standins/echo_engine.py`, not a model: it shows what reached an engine): personal data
redacted before the engine sees it and put back in the client's answer, whole and streamed three
bytes a chunk; a key's own policy (the narrowest) blocking a tenant pattern with an error that
names the policy and the category, never the text, and spending nothing of the key's limits; an
answer blocked by an output check; a pattern RE2 does not take refused when the policy is put."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import openai
import pytest

from llmgw.bus import BadRequest, call, free_port
from llmgw.proto import Limits, Project, guard
from llmgw.proto.guard import Check, Policy
from tests.test_router import CPU, MODEL, engines, world  # noqa: F401 (the fixtures)

ECHO = Path(__file__).parent / "standins" / "echo_engine.py"
SAID = "mail ada@example.com, card 4111 1111 1111 1111, key sk-abcdefghijklmnopqrstuvwxyz0123"


@pytest.fixture
def echo(tmp_path):
    port, record = free_port(), tmp_path / "sent.jsonl"
    proc = subprocess.Popen([sys.executable, str(ECHO), str(port), str(record)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    yield f"http://127.0.0.1:{port}", record
    proc.kill()
    proc.wait()


async def test_personal_data_is_redacted_for_the_engine_and_put_back_for_the_client(world, echo, nc):  # noqa: F811
    url, record = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    pii = Policy(name="pii", input=[Check(kind="pii", action="redact")], by="t")
    await call(nc, guard.GUARD_PUT, pii)
    client = await world.client()
    whole = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": SAID}])
    assert whole.choices[0].message.content == f"You said: {SAID}"
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": SAID}], stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces) == f"You said: {SAID}" and len(pieces) > 10
    sent = record.read_text()
    assert "ada@example.com" not in sent and "4111" not in sent and "sk-abc" not in sent
    engine_saw = json.loads(sent.splitlines()[0])["messages"][0]["content"]
    assert engine_saw == "mail <EMAIL_1>, card <CARD_1>, key <SECRET_1>"


async def test_a_keys_own_policy_blocks_names_the_category_and_spends_nothing(world, echo, nc):  # noqa: F811
    url, _ = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    await call(nc, guard.GUARD_PUT, Policy(name="pii", input=[Check(kind="pii", action="redact")], by="t"))
    client = await world.client(name="secretive", limits=Limits(requests_per_minute=100))
    key_id = next(kid for kid, k in (await world.router.accounts.list_keys()).keys.items() if k.name == "secretive")
    codename = Check(kind="pattern", action="block", pattern=r"(?i)project\s+falcon", label="CODENAME")
    narrow = Policy(name="codenames", applies_to="key", target=key_id, input=[codename], by="t")
    await call(nc, guard.GUARD_PUT, narrow)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "status of Project Falcon?"}]
        )
    error = refused.value.body
    assert error["code"] == "guardrail_blocked" and "policy 'codenames'" in error["message"]
    assert "CODENAME" in error["message"] and "Falcon" not in error["message"]
    for _ in range(100):  # a blocked request spends nothing: its admission is given back
        counts = await world.router.accounts.quota.read(f"key.{key_id}", time.time())
        if counts.minute_requests == 0 and counts.concurrent == 0:
            break
        await asyncio.sleep(0.05)
    assert counts.minute_requests == 0 and counts.concurrent == 0, counts
    ok = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "mail ada@example.com"}])
    assert ok.choices[0].message.content == "You said: mail ada@example.com"  # the key's policy: no redaction

    with pytest.raises(BadRequest, match="is not one RE2 takes"):
        await call(nc, guard.GUARD_PUT, Policy(name="bad", input=[Check(kind="pattern", pattern="(unclosed")]))
    catastrophic = Check(kind="pattern", action="block", pattern="(a+)+$", label="AS")
    await call(nc, guard.GUARD_PUT, Policy(name="codenames", applies_to="key", target=key_id, input=[catastrophic]))
    started = time.monotonic()  # a text that makes a backtracking engine try every way before failing
    long = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a" * 50_000 + "!"}])
    assert long.choices[0].message.content.endswith("a!") and time.monotonic() - started < 30  # RE2: linear


async def test_an_answer_an_output_check_refuses_is_not_given(world, echo, nc):  # noqa: F811
    url, _ = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    outward = Policy(name="no-mail-out", output=[Check(kind="pii", action="block", entities=["email"])], by="t")
    await call(nc, guard.GUARD_PUT, outward)
    client = await world.client()
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "write ada@example.com"}])
    assert "answer was blocked by guardrail policy 'no-mail-out'" in refused.value.body["message"]
    await asyncio.sleep(0)


async def test_a_streamed_answer_is_checked_as_it_comes_masked_or_ended_by_a_block(world, echo, nc):  # noqa: F811
    url, _ = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    masking = Policy(name="mask-out", output=[Check(kind="pii", action="redact", entities=["email", "iban"])], by="t")
    await call(nc, guard.GUARD_PUT, masking)
    client = await world.client()
    said = "write ada@example.com, pay GB82 WEST 1234 5698 7654 32, then bob@example.com " + "and so on " * 20
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": said}], stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    masked = said.replace("ada@example.com", "<EMAIL_1>").replace("bob@example.com", "<EMAIL_2>")
    assert "".join(pieces) == "You said: " + masked.replace("GB82 WEST 1234 5698 7654 32", "<IBAN_1>")
    assert sum(1 for p in pieces if p) > 3  # given out as it came, not held to the end

    blocking = Policy(name="mask-out", output=[Check(kind="pattern", action="block", pattern="falcon", label="CODE")])
    await call(nc, guard.GUARD_PUT, msgspec.structs.replace(blocking, by="t"))
    early = "and so on " * 20 + "falcon " + "more " * 20
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": early}], stream=True)
    got = []
    with pytest.raises(openai.APIError, match="policy 'mask-out'"):
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "and so on" in "".join(got) and "falcon" not in "".join(got)  # what was checked, then the error


def _ctl(nats_server, *words: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], capture_output=True, text=True, timeout=60)


async def test_ctl_puts_lists_and_removes_a_policy_and_says_what_a_wrong_check_is(world, nats_server):  # noqa: F811
    ctl = lambda *w: asyncio.to_thread(_ctl, nats_server, *w)  # noqa: E731
    made = await ctl("guard", "put", "pii", "--input", "pii:redact:email", "--input", "pattern:block:CODE:(?i)falcon:x")
    assert made.returncode == 0 and "policy pii of default: on tenant, 2 in, 0 out" in made.stderr, made.stderr
    wrong = await ctl("guard", "put", "bad", "--input", "pii:explode")
    assert wrong.returncode == 1 and "block" in wrong.stderr and "explode" in wrong.stderr, wrong.stderr
    listed = (await ctl("guard", "list")).stdout
    assert "pii:redact:email; pattern:block:CODE:(?i)falcon:x" in listed
    assert (await ctl("guard", "remove", "pii")).returncode == 0
    assert "pii" not in (await ctl("guard", "list")).stdout


SERVICE = Path(__file__).parent / "standins" / "guard_service.py"


@pytest.fixture
def services():
    made = []

    def start(mode: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(SERVICE), str(port), mode], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "listening"
        made.append(proc)
        return f"http://127.0.0.1:{port}/check"

    yield start
    for proc in made:
        proc.kill()
        proc.wait()


async def test_an_outside_service_blocks_redacts_and_fails_closed_or_open_as_told(world, echo, nc, services):  # noqa: F811
    url, record = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    client = await world.client()

    async def ask(text: str):
        return await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])

    service = Check(kind="service", url=services("ok"), timeout_s=1.0)
    pii = Check(kind="pii", entities=["email"])
    await call(nc, guard.GUARD_PUT, Policy(name="outside", input=[pii, service], by="t"))
    answered = await ask("ticket ID-4471 from ada@example.com")
    assert answered.choices[0].message.content == "You said: ticket ID-4471 from ada@example.com"
    engine_saw = json.loads(record.read_text().splitlines()[-1])["messages"][0]["content"]
    assert engine_saw == "ticket <INTERNAL_ID_1> from <EMAIL_1>"  # the service saw the e-mail redacted already
    with pytest.raises(openai.BadRequestError) as refused:
        await ask("something forbidden")
    assert "policy 'outside': it holds BANNED" in refused.value.body["message"]

    for mode, why in (("slow", "did not answer in 1 s"), ("500", "answered 500"), ("garbage", "is not a verdict")):
        closed = Check(kind="service", url=services(mode), timeout_s=1.0, on_error="block")
        await call(nc, guard.GUARD_PUT, Policy(name="outside", input=[closed], by="t"))
        with pytest.raises(openai.BadRequestError) as failed:
            await ask("hello")
        assert why in failed.value.body["message"] and "fails closed" in failed.value.body["message"]
    down = Check(kind="service", url=f"http://127.0.0.1:{free_port()}/check", timeout_s=1.0, on_error="pass")
    await call(nc, guard.GUARD_PUT, Policy(name="outside", input=[down], by="t"))
    assert (await ask("hello")).choices[0].message.content == "You said: hello"  # fails open


async def test_a_judge_model_is_asked_through_the_routers_own_routing_and_its_verdict_holds(world, echo, nc):  # noqa: F811
    """The judge: a real llama-server with the test's tiny model, held by a grammar to Qwen3Guard's
    format (a stand-in for a guard model: what it says is random, but always a verdict)."""
    url, _ = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    judge = msgspec.structs.replace(MODEL, name="judge", aliases=[])
    await world.model(judge)
    await world.replica(judge, CPU)
    with pytest.raises(BadRequest, match="no model 'nobody' to judge with"):
        await call(nc, guard.GUARD_PUT, Policy(name="judged", input=[Check(kind="judge", judge="nobody")]))
    client = await world.client()
    for fmt in ("qwen3guard", "llamaguard"):
        check = Check(kind="judge", judge="judge", action="block", judge_format=fmt)
        await call(nc, guard.GUARD_PUT, Policy(name=f"judged-{fmt}", input=[check]))
        try:
            answered = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
            assert answered.choices[0].message.content == "You said: hello"
        except openai.BadRequestError as exc:  # the judge's verdict was unsafe: blocked, naming its category
            assert exc.body["code"] == "guardrail_blocked" and f"policy 'judged-{fmt}'" in exc.body["message"]
        found = {k: n for k, n in world.router.gateway.metrics.guard.items() if k[0] == f"judged-{fmt}"}
        assert found and all(category != "JUDGE_DOWN" for _, category, _ in found), found


async def test_a_request_its_key_may_not_make_is_refused_before_a_judge_is_asked(world, echo, nc):  # noqa: F811
    """A judge's work (a model's time, the tenant's tokens) is spent on admitted requests only: a
    key past its limit is told 429 without its request being judged first."""
    url, record = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    judge = msgspec.structs.replace(MODEL, name="judge", aliases=[])
    await world.model(judge)
    await world.replica(judge, CPU, url=url)  # the echo engine: every request it gets is recorded
    check = Check(kind="judge", judge="judge", action="block", on_error="pass")
    await call(nc, guard.GUARD_PUT, Policy(name="judged", input=[check]))
    client = await world.client(limits=Limits(requests_per_minute=1))
    hello = [{"role": "user", "content": "hello"}]
    assert (await client.chat.completions.create(model="m", messages=hello)).choices[0].message.content
    for _ in range(3):
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="m", messages=hello)
    asked = [json.loads(line)["model"] for line in record.read_text().splitlines()]
    assert asked.count("judge") == 1 and asked.count("m") == 1, asked

    # the judge's question is the request's own: it takes no second place among the project's one
    await world.router.accounts.put_project(Project(name="default", limits=Limits(concurrent=1)))
    one_at_a_time = await world.client(name="one-at-a-time")
    answered = await one_at_a_time.chat.completions.create(model="m", messages=hello)
    assert answered.choices[0].message.content == "You said: hello"
    asked = [json.loads(line)["model"] for line in record.read_text().splitlines()]
    assert asked.count("judge") == 2 and asked.count("m") == 2, asked  # judged, not refused a place


async def test_a_megabyte_prompt_full_of_personal_data_is_redacted_and_given_back_whole(world, echo, nc):  # noqa: F811
    url, record = echo
    await world.model(MODEL)
    await world.replica(MODEL, CPU, url=url)
    await call(nc, guard.GUARD_PUT, Policy(name="pii", input=[Check(kind="pii", action="redact")], by="t"))
    client = await world.client()
    piece = "write to ada@example.com or +44 20 7946 0958 about card 4111 1111 1111 1111 today. "
    big = piece * (1_000_000 // len(piece))
    answered = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": big}])
    assert answered.choices[0].message.content == f"You said: {big}"
    sent = json.loads(record.read_text().splitlines()[-1])["messages"][0]["content"]
    assert "ada@" not in sent and sent.startswith("write to <EMAIL_1> or <PHONE_1> about card <CARD_1> today.")
