"""The tools page against the real router: an admin sees each MCP server and its state, the tool
rules, the latest calls (who, which tool, how it ended) and each outside provider's keys (never a
key itself); an operator of another tenant sees none of them and no provider; a member does not
open the page."""

from __future__ import annotations

import asyncio
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from llmgw.bus import call
from llmgw.proto import KeyCreate, providers, tools
from llmgw.proto.providers import Provider, ProviderKey
from llmgw.proto.tools import McpServer, ToolRule
from tests.test_tools import TOOLS


async def test_the_page_shows_servers_rules_calls_and_providers_to_whom_they_belong(stack):
    command = [sys.executable, str(TOOLS), "--name", "files"]
    await call(stack.nc, tools.MCP_PUT, McpServer(name="files", transport="stdio", command=command))
    await call(stack.nc, tools.RULE_PUT, ToolRule(deny=["*__big"]))
    secret = "sk-never-shown-0123456789"
    keys = [ProviderKey(name="team-a", key=secret, requests_per_minute=60)]
    outside = Provider(name="acme", base_url="http://127.0.0.1:9/v1", keys=keys, models={"mini": "gpt-x"})
    await call(stack.nc, providers.PROVIDER_PUT, outside)
    for _ in range(600):
        link = stack.router.tools.links.get("default.files") if stack.router.tools else None
        if link is not None and link[1].state.state == "ready":
            break
        await asyncio.sleep(0.05)
    key = await stack.router.accounts.create_key(KeyCreate(name="dev"))
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key.key}"}, timeout=30)
    async with Client(streamable_http_client(f"{stack.url}/mcp", http_client=http)) as client:
        await client.call_tool("files__add", {"a": 1, "b": 2})
        await client.call_tool("files__big", {"megabytes": 1})  # refused by the tenant's rule
    await asyncio.sleep(0.3)  # the calls' records are published, not waited on

    admin = await stack.signed_in()
    page = await admin.page("/console/tools")
    assert page.status_code == 200 and 'data-server="files"' in page.text and "ready" in page.text
    assert "*__big" in page.text and "files__add" in page.text and "<strong>refused</strong>" in page.text
    assert 'data-key="acme.team-a"' in page.text and secret not in page.text

    olga = await stack.user_signed_in("olga", "lab", "operator")
    theirs = await olga.get("/console/tools")
    assert theirs.status_code == 200 and 'data-server="files"' not in theirs.text
    assert "files__add" not in theirs.text and 'data-key="acme.team-a"' not in theirs.text
    mia = await stack.user_signed_in("mia", "lab", "member")
    assert (await mia.get("/console/tools")).status_code in (403, 404)
