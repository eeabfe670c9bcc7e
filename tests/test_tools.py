"""The company's MCP tools through the gateway: real MCP servers made with the official SDK
(`tests/mcp_tools.py`, one over streamable HTTP behind a token, one over stdio that the router
runs), the router on a real NATS, and the official MCP client signed in with llmgw keys. A key
sees and calls only the tools its rules let through, named by server; every call is recorded;
a stdio server whose program ends is started again; servers that never answer, answer garbage,
list ten thousand tools or return 50 MB are each said for what they are."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import httpx2
import mcp_types as types
import msgspec
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from llmgw.bus import BadRequest, call, new_fleet_secret, write_secret
from llmgw.proto import KeyCreate, Limits, guard, people, tools
from llmgw.proto.guard import Check, Policy
from llmgw.proto.people import Tenant, UserCreate
from llmgw.proto.tools import CallQuery, McpServer, ServerRef, ToolQuery, ToolRule, ToolRuleRef
from llmgw.router.service import Router, RouterConfig

TOOLS = Path(__file__).parent / "mcp_tools.py"
TOKEN = "tool-server-token"


@pytest.fixture
async def router(serve, tmp_path):
    secret = tmp_path / "engine-fleet.secret"
    write_secret(secret, new_fleet_secret())
    config = RouterConfig(http_port=0, engine_secret=str(secret))
    router = await serve(Router(config), config)
    await _until(lambda: router.tools is not None, "the router opened its tools")
    return router


def _http_server(*more: str):
    proc = subprocess.Popen([sys.executable, str(TOOLS), "--http", *more], stdout=subprocess.PIPE, text=True)
    port = proc.stdout.readline().split()[-1]
    yield f"http://127.0.0.1:{port}/mcp"
    proc.kill()
    proc.wait()


@pytest.fixture
def http_tools():
    """The HTTP tool server (named `search`), asking for `TOKEN`, answering in JSON."""
    yield from _http_server("--name", "search", "--token", TOKEN)


@pytest.fixture
def sse_tools():
    """An HTTP tool server (named `stream`) answering in event streams."""
    yield from _http_server("--name", "stream", "--sse")


async def _until(check, what, timeout_s=30.0):
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def _state(router, name, tenant="default"):
    found = router.tools.links.get(f"{tenant}.{name}")
    return found[1].state if found else None


def _is(router, name, state) -> bool:
    found = _state(router, name)
    return found is not None and found.state == state


async def _ready(router, nc, *servers: McpServer):
    for server in servers:
        await call(nc, tools.MCP_PUT, server)
    for server in servers:
        await _until(lambda s=server: _is(router, s.name, "ready"), f"{server.name} ready")


async def _key(router, **key) -> tuple[str, str]:
    """A new key's id and secret."""
    made = await router.accounts.create_key(KeyCreate(name=key.pop("name", "dev"), **key))
    return made.id, made.key


def _client(router, key: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return Client(streamable_http_client(f"{router.http.url}/mcp", http_client=http))


def _text(result: types.CallToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, types.TextContent))


STDIO = McpServer(name="files", transport="stdio", command=[sys.executable, str(TOOLS), "--name", "files"])


async def test_a_key_lists_and_calls_its_tenants_tools_over_http_and_stdio_each_call_recorded(router, nc, http_tools):
    search = McpServer(name="search", url=http_tools, headers={"Authorization": f"Bearer {TOKEN}"}, by="ops")
    files = McpServer(name="files", transport="stdio", command=STDIO.command, record_arguments=True)
    await _ready(router, nc, search, files)
    listed = await call(nc, tools.MCP_LIST, ToolQuery())
    assert {s.name: s.headers for s in listed.servers} == {"files": {}, "search": {"Authorization": "(hidden)"}}
    kept = msgspec.json.decode((await router.tools.servers.kv.get("default.search")).value, type=McpServer)
    replayed = McpServer(name="mine", url="http://127.0.0.1:9/mcp", headers=kept.headers)
    with pytest.raises(BadRequest, match="not a sealed one"):  # a sealed value sent back elsewhere is refused
        await call(nc, tools.MCP_PUT, replayed)
    moved = msgspec.structs.replace(search, url="http://127.0.0.1:9/mcp", headers={"Authorization": "(hidden)"})
    with pytest.raises(BadRequest, match="give the value of Authorization"):  # a header goes only where it was given
        await call(nc, tools.MCP_PUT, moved)
    assert TOKEN not in (await router.tools.servers.kv.get("default.search")).value.decode()  # sealed at rest
    for name in ("my__fs", "my_"):  # `my__fs__read`, `my___read`: whose tool?
        with pytest.raises(BadRequest, match="a server's name holds no '__' and does not end in '_'"):
            await call(nc, tools.MCP_PUT, McpServer(name=name, url="http://127.0.0.1:9/mcp"))
    _, key = await _key(router)
    async with _client(router, key) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"search__add", "search__echo", "files__echo", "files__add"} <= names  # one name, two servers
        assert _text(await client.call_tool("search__add", {"a": 2, "b": 3})) == "5"
        assert _text(await client.call_tool("files__echo", {"text": "hi"})) == "files heard: hi"
        refused = await client.call_tool("other__echo", {"text": "hi"})
        assert refused.is_error and "No tool 'other__echo' among those this key may use" in _text(refused)
    await asyncio.sleep(0.3)  # the records are published, not waited on
    calls = (await call(nc, tools.MCP_CALLS, CallQuery())).calls
    assert [(c.server, c.tool, c.outcome) for c in calls] == [
        ("other", "echo", "refused"),
        ("files", "echo", "ok"),
        ("search", "add", "ok"),
    ]
    assert calls[1].arguments == '{"text":"hi"}' and calls[2].arguments == ""  # kept only where asked
    assert all(c.who == "dev" and c.ms >= 0 for c in calls)


async def test_an_error_a_server_answers_a_call_with_ends_that_call_and_leaves_the_server_linked(router, nc):
    await _ready(router, nc, STDIO)
    _, key = await _key(router)
    async with _client(router, key) as client:
        before = _text(await client.call_tool("files__pid", {}))
        internal = await client.call_tool("files__refuse", {"code": -32603})
        assert internal.is_error and "the server refuses" in _text(internal), _text(internal)
        since = _state(router, "files").since
        said = await client.call_tool("files__refuse", {"code": -32000})  # the SDK's code for a connection closed
        assert said.is_error and "the server refuses" in _text(said), _text(said)
        await _until(lambda: _state(router, "files").since > since, "the link looking again at once")
        assert _is(router, "files", "ready"), _state(router, "files")  # listed again, not connected again
        assert _text(await client.call_tool("files__pid", {})) == before


async def test_a_tool_call_counts_against_its_keys_limits_as_a_request_does(router, nc):
    await _ready(router, nc, STDIO)
    key_id, key = await _key(router, name="capped", limits=Limits(requests_per_minute=2))
    async with _client(router, key) as client:
        assert [_text(await client.call_tool("files__add", {"a": 1, "b": n})) for n in (1, 2)] == ["2", "3"]
        third = await client.call_tool("files__add", {"a": 1, "b": 3})
        assert third.is_error and "Rate limit: key 'capped'" in _text(third), _text(third)
        listed = await client.list_tools()  # listing asks nothing of a server: not counted
        assert "files__add" in {t.name for t in listed.tools}
    await asyncio.sleep(0.3)
    calls = [c for c in (await call(nc, tools.MCP_CALLS, CallQuery())).calls if c.key == key_id]
    assert [c.outcome for c in calls] == ["refused", "ok", "ok"] and "Rate limit" in calls[0].reason


async def test_rules_narrow_a_tenants_tools_by_project_and_key_and_a_key_with_none_lists_none(router, nc):
    await _ready(router, nc, STDIO)
    await call(nc, tools.RULE_PUT, ToolRule(deny=["*__big", "*__slow"]))
    await call(nc, tools.RULE_PUT, ToolRule(applies_to="project", target="default", allow=["files__*"]))
    narrow_id, narrow = await _key(router, name="narrow")
    await call(nc, tools.RULE_PUT, ToolRule(applies_to="key", target=narrow_id, allow=[]))
    for target in ("a.b", "a b", "*", ">"):  # never a KV key: said, not a server error
        with pytest.raises(BadRequest, match="target"):
            await call(nc, tools.RULE_PUT, ToolRule(applies_to="project", target=target, allow=[]))
        with pytest.raises(BadRequest, match="target"):
            await call(nc, tools.RULE_REMOVE, ToolRuleRef(applies_to="project", target=target))
    _, wide = await _key(router, name="wide")
    async with _client(router, wide) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert listed == {
            "files__add",
            "files__contact",
            "files__echo",
            "files__pid",
            "files__refuse",
            "files__shout",
            "files__tally",
        }
    async with _client(router, narrow) as client:
        assert (await client.list_tools()).tools == []  # no rights: an empty list, not an error
        refused = await client.call_tool("files__add", {"a": 1, "b": 1})
        assert refused.is_error and "may use" in _text(refused)
    other = await router.accounts.create_key(KeyCreate(name="elsewhere", tenant="default", project="p2"))
    async with _client(router, other.key) as client:
        assert "files__big" not in {t.name for t in (await client.list_tools()).tools}  # the tenant's deny holds


async def test_a_request_without_a_key_is_refused_and_a_stdio_server_that_ends_is_started_again(router, nc):
    async with httpx.AsyncClient() as http:
        asked = await http.post(f"{router.http.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert asked.status_code == 401 and asked.headers["www-authenticate"].startswith("Bearer")
    await _ready(router, nc, STDIO)
    _, key = await _key(router)
    huge = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "files__echo", "arguments": {}}}
    huge["params"]["arguments"]["text"] = "x" * (5 * 1024 * 1024)
    async with httpx.AsyncClient(timeout=60) as http:
        headers = {"authorization": f"Bearer {key}", "accept": "application/json, text/event-stream"}
        refused = await http.post(f"{router.http.url}/mcp", json=huge, headers=headers)
    assert refused.status_code == 413  # a body past 4 MiB is refused
    async with _client(router, key) as client:
        first = int(_text(await client.call_tool("files__pid", {})))
        os.kill(first, signal.SIGKILL)
        await _until(lambda: not _is(router, "files", "ready"), "the link saw its server end")
        await _until(lambda: _is(router, "files", "ready"), "started again")
        again = int(_text(await client.call_tool("files__pid", {})))
    assert again != first


def _silent_port() -> tuple[socket.socket, int]:
    """A port that takes connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, sock.getsockname()[1]


def _garbage_port() -> int:
    """An HTTP server that answers every request with 200 and words that are not MCP."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def answer():
        while True:
            conn, _ = sock.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    return sock.getsockname()[1]


async def test_servers_that_never_answer_answer_garbage_list_too_much_or_return_too_much_are_said(
    router, nc, http_tools, sse_tools
):
    silent, port = _silent_port()
    quiet = McpServer(name="quiet", url=f"http://127.0.0.1:{port}/mcp", timeout_s=2)
    garbage = McpServer(name="garbage", url=f"http://127.0.0.1:{_garbage_port()}/mcp", timeout_s=5)
    crowd = McpServer(name="crowd", transport="stdio", command=[*STDIO.command, "--many", "10000"], timeout_s=60)
    lazy = McpServer(name="lazy", transport="stdio", command=STDIO.command, timeout_s=2)
    search = McpServer(name="search", url=http_tools, headers={"Authorization": f"Bearer {TOKEN}"}, timeout_s=60)
    stream = McpServer(name="stream", url=sse_tools, timeout_s=60)
    for server in (quiet, garbage):
        await call(nc, tools.MCP_PUT, server)
    await _ready(router, nc, crowd, search, lazy, stream)
    await _until(lambda: _is(router, "quiet", "failed"), "the silent server failed")
    await _until(lambda: _is(router, "garbage", "failed"), "the garbage server failed")
    states = (await call(nc, tools.MCP_LIST, ToolQuery())).states
    assert "could not connect" in states["default.quiet"].reason
    assert "could not connect" in states["default.garbage"].reason
    assert states["default.crowd"].tools == 1000 and "more than 1000 tools" in states["default.crowd"].reason
    _, key = await _key(router)
    async with _client(router, key) as client:
        assert len((await client.list_tools()).tools) == 1000 + 3 * 9  # the crowd's first thousand, and the rest
        huge = await client.call_tool("search__big", {"megabytes": 50})  # cut as it came, never held whole
        assert huge.is_error and "over the 4,194,304 bytes passed back (cut there)" in _text(huge), _text(huge)
        streamed = await client.call_tool("stream__big", {"megabytes": 50})
        assert streamed.is_error and "over the 4,194,304 bytes passed back (cut there)" in _text(streamed)
        fits = await client.call_tool("stream__big", {"megabytes": 1.5})  # text and structured: a 3 MiB event
        assert not fits.is_error and len(_text(fits)) == 1.5 * 2**20, _text(fits)[:200]
        late = await client.call_tool("lazy__slow", {"seconds": 10})
        assert late.is_error and "no answer within 2 s" in _text(late)
    outcomes = [(c.server, c.outcome) for c in (await call(nc, tools.MCP_CALLS, CallQuery())).calls]
    assert outcomes == [("lazy", "timeout"), ("stream", "ok"), ("stream", "error"), ("search", "error")]
    await call(nc, tools.MCP_REMOVE, ServerRef(name="crowd"))
    await _until(lambda: _state(router, "crowd") is None, "the crowd's link closed")
    silent.close()


async def test_a_policy_covering_tools_redacts_arguments_puts_values_back_and_blocks_calls(router, nc):
    await _ready(router, nc, msgspec.structs.replace(STDIO, record_arguments=True))
    codename = Check(kind="pattern", action="block", pattern=r"(?i)project\s+falcon", label="CODENAME")
    pii = [Check(kind="pii", action="redact")]
    await call(nc, guard.GUARD_PUT, Policy(name="chats", input=[codename]))  # chats only: tools pass
    _, key = await _key(router)
    async with _client(router, key) as client:
        assert _text(await client.call_tool("files__shout", {"text": "project falcon"})) == "PROJECT FALCON"
        await call(nc, guard.GUARD_PUT, Policy(name="chats", input=[*pii, codename], tools=True))
        said = await client.call_tool("files__shout", {"text": "mail ada@example.com"})
        assert _text(said) == "MAIL ada@example.com"  # the tool saw a placeholder; the value put back
        blocked = await client.call_tool("files__shout", {"text": "status of Project Falcon"})
        await call(nc, guard.GUARD_PUT, Policy(name="chats", input=[*pii, codename], output=pii, tools=True))
        told = await client.call_tool("files__contact", {})  # what a tool says is checked on its own
        assert _text(told) == "write to <EMAIL_1>"  # redacted, and left so
        # an object's keys are text too: checked as its values are, going in and coming back
        hidden = await client.call_tool("files__tally", {"counts": {"status of Project Falcon": 1}})
        keyed = await client.call_tool("files__tally", {"counts": {"ada@example.com": 2}})
        assert keyed.structured_content == {"<EMAIL_1>": 2}, keyed
    reason = _text(blocked)
    assert blocked.is_error and "policy 'chats'" in reason and "CODENAME" in reason and "Falcon" not in reason
    assert hidden.is_error and "CODENAME" in _text(hidden) and "Falcon" not in _text(hidden)
    await asyncio.sleep(0.3)
    calls = (await call(nc, tools.MCP_CALLS, CallQuery())).calls
    assert [c.outcome for c in calls] == ["ok", "blocked", "ok", "blocked", "ok", "ok"]  # the latest first
    assert calls[4].arguments == '{"text":"mail <EMAIL_1>"}'  # kept as the tool got it: never the value
    assert calls[0].arguments == '{"counts":{"<EMAIL_1>":2}}'


VSCODE = {"user-agent": "Visual Studio Code/1.124.0", "content-type": "application/json"}
VSCODE_ACCEPT = "text/event-stream, application/json"
VSCODE_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {
            "roots": {"listChanged": True},
            "sampling": {},
            "elicitation": {"form": {}, "url": {}},
            "tasks": {
                "list": {},
                "cancel": {},
                "requests": {"sampling": {"createMessage": {}}, "elicitation": {"create": {}}},
            },
            "extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}},
        },
        "clientInfo": {"name": "Visual Studio Code", "version": "1.124.0"},
    },
}
"""VS Code's first request to an `"type": "http"` server, as its trace log shows it (VS Code
1.124, microsoft/vscode#319528), its name and version those of a stable build."""


async def test_the_requests_vs_code_sends_list_and_call_the_keys_tools(router, nc):
    await _ready(router, nc, STDIO)
    _, key = await _key(router)
    url = f"{router.http.url}/mcp"
    headers = {**VSCODE, "authorization": f"Bearer {key}", "accept": VSCODE_ACCEPT}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        began = await http.post(url, json=VSCODE_INITIALIZE)
        assert began.status_code == 200, began.text
        result = began.json()["result"]
        assert result["protocolVersion"] == "2025-11-25" and "tools" in result["capabilities"]
        assert (await http.post(url, json={"method": "notifications/initialized", "jsonrpc": "2.0"})).status_code == 202
        stream = await http.get(url, headers={"accept": "text/event-stream"})
        assert stream.status_code == 405 and stream.headers["allow"] == "POST"  # VS Code carries on without one
        listed = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
        names = [t["name"] for t in listed.json()["result"]["tools"]]
        assert "files__add" in names
        meta = {"progressToken": "0f6d5c1e", "vscode.conversationId": "c1", "vscode.requestId": "r1"}
        params = {"name": "files__add", "arguments": {"a": 20, "b": 22}, "_meta": meta}
        called = await http.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params})
        assert called.json()["result"]["content"][0]["text"] == "42"


def _ctl(nats_server, *words: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], capture_output=True, text=True, timeout=60)


async def test_ctl_registers_lists_narrows_and_removes_and_says_what_is_wrong(router, nats_server):
    ctl = lambda *w: asyncio.to_thread(_ctl, nats_server, *w)  # noqa: E731
    command = f"{sys.executable} {TOOLS} --name files"
    made = await ctl("mcp", "put", "files", "--command", command, "--record-arguments")
    assert made.returncode == 0 and "MCP server files of default" in made.stderr, made.stderr
    await _until(lambda: _is(router, "files", "ready"), "files ready")
    listed = (await ctl("mcp", "list")).stdout
    assert "files" in listed and "stdio" in listed and "ready" in listed and " 9 " in listed
    narrowed = await ctl("mcp", "allow", "files__add", "--deny", "files__big", "--project", "default")
    assert "project default may use files__add, but not files__big" in narrowed.stderr, narrowed.stderr
    assert "files__add" in (await ctl("mcp", "rules")).stdout
    assert (await ctl("mcp", "unrule", "--project", "default")).returncode == 0
    both = await ctl("mcp", "put", "x", "--url", "http://h/mcp", "--command", "y")
    assert both.returncode != 0 and "--url" in both.stderr and "--command" in both.stderr
    header = await ctl("mcp", "put", "x", "--url", "http://h/mcp", "--header", "no-colon")
    assert header.returncode != 0 and "give it as Name: value" in header.stderr
    nowhere = await ctl("mcp", "put", "x", "--url", "ftp://h/mcp")
    assert nowhere.returncode != 0 and "http:// or https://" in nowhere.stderr
    stranger = await ctl("mcp", "put", "x", "--url", "http://h/mcp", "--tenant", "nobody")
    assert stranger.returncode != 0 and "nobody" in stranger.stderr
    assert (await ctl("mcp", "remove", "files")).returncode == 0
    missing = await ctl("mcp", "remove", "files")
    assert missing.returncode != 0 and "no MCP server 'files'" in missing.stderr


async def test_over_the_admin_api_an_operator_changes_only_its_tenants_servers_and_a_member_none(router, nc):
    keys = {}
    for tenant in ("lab", "shop"):
        await call(nc, people.TENANT_PUT, Tenant(name=tenant, by="t"))
        for role in ("member", "operator"):
            user = f"{tenant}-{role}"
            await call(nc, people.USER_CREATE, UserCreate(name=user, tenant=tenant, role=role, by="t"))
            made = await router.accounts.create_key(KeyCreate(name=user, tenant=tenant, owner=user))
            keys[user] = {"authorization": f"Bearer {made.key}"}
    api, body = f"{router.http.url}/api/v1/mcp-servers", {"url": "http://127.0.0.1:9/mcp"}
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.put(f"{api}/lab/files", headers=keys["lab-operator"], json=body)
        assert made.status_code == 200 and made.json()["by"] == "lab-operator", made.text
        program = {"transport": "stdio", "command": STDIO.command}
        runs = await http.put(f"{api}/lab/prog", headers=keys["lab-operator"], json=program)
        assert runs.status_code == 403 and "only an admin registers one" in runs.text
        elsewhere = await http.put(f"{api}/shop/files", headers=keys["lab-operator"], json=body)
        assert elsewhere.status_code == 404 and "No tenant 'shop' among yours" in elsewhere.text
        member = await http.put(f"{api}/lab/other", headers=keys["lab-member"], json=body)
        assert member.status_code == 403 and "operator role" in member.text
        seen = await http.get(api, headers=keys["shop-operator"])
        assert seen.status_code == 200 and seen.json()["servers"] == []  # lab's reads as not there
        assert [s["name"] for s in (await http.get(api, headers=keys["lab-member"])).json()["servers"]] == ["files"]
        calls = await http.get(f"{router.http.url}/api/v1/tool-calls", headers=keys["lab-member"])
        assert calls.status_code == 403
