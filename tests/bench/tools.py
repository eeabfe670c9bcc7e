"""What a tool call through the gateway's MCP endpoint adds, beside the same call made to the MCP
server directly, in one run (issue 38).

`llmgw up` runs the fleet (its router in a process of its own, as a user starts it); a real MCP
server made with the official SDK (`tests/mcp_tools.py`, streamable HTTP, stateless, JSON
answers) is registered with it. The official MCP client calls the server's `add` tool, one call
at a time: directly, and through the router's `/mcp` signed in with `up`'s key (every call there
checks the key, the key's rules, and records the call). Rounds alternate between the two ways so
that the machine's noise falls on both. Figures: p50 and p99 of a call, and what the gateway adds.
Run with `python tests/bench/tools.py [--calls N] [--rounds R]` (`just bench` runs it too).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).parent))
from first_answer import start_up

from llmgw.bus import call, connect
from llmgw.proto import tools
from llmgw.proto.tools import McpServer, ToolQuery

TOOLS = Path(__file__).parents[1] / "mcp_tools.py"


def _client(url: str, key: str = "") -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


async def _times(client: Client, calls: int) -> list[float]:
    out = []
    for i in range(calls):
        started = time.perf_counter()
        result = await client.call_tool(_name(client), {"a": i, "b": 1})
        out.append((time.perf_counter() - started) * 1000)
        if result.is_error:
            raise RuntimeError(f"the call failed: {result.content}")
    return out


def _name(client: Client) -> str:
    return "add" if client.server_info and client.server_info.name == "bench" else "bench__add"


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def measure(direct_url: str, gateway_url: str, key: str, calls: int, rounds: int) -> dict[str, list[float]]:
    """Each way's call times (ms), `rounds` alternating rounds of `calls` calls."""
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    async with _client(direct_url) as direct, _client(gateway_url, key) as gateway:
        await _times(direct, 20)
        await _times(gateway, 20)  # warm: connections open, code paths taken
        for _ in range(rounds):
            times["direct"] += await _times(direct, calls)
            times["gateway"] += await _times(gateway, calls)
    return times


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    """`llmgw up` and the tool server started, the server registered, both ways measured."""
    argv = [sys.executable, str(TOOLS), "--http", "--name", "bench"]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    direct_url = f"http://127.0.0.1:{server.stdout.readline().split()[-1]}/mcp"
    with tempfile.TemporaryDirectory() as work:
        home = Path(work) / "up"
        proc, base, key, nats_url = start_up(home)
        try:
            nc = await connect(nats_url, "bench", creds=str(home / "creds" / "ctl.nk"))
            await call(nc, tools.MCP_PUT, McpServer(name="bench", url=direct_url))
            for _ in range(600):
                states = (await call(nc, tools.MCP_LIST, ToolQuery())).states
                if states.get("default.bench") and states["default.bench"].state == "ready":
                    break
                await asyncio.sleep(0.1)
            await nc.close()
            return await measure(direct_url, base.removesuffix("/v1") + "/mcp", key, calls, rounds)
        finally:
            proc.terminate()
            proc.wait(60)
            server.kill()


def main() -> None:
    """Print the table."""
    ask = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ask.add_argument("--calls", type=int, default=200, help="calls a round (default 200)")
    ask.add_argument("--rounds", type=int, default=5, help="rounds each way (default 5)")
    args = ask.parse_args()
    times = asyncio.run(run(args.calls, args.rounds))
    d50, d99 = _pct(times["direct"], 50), _pct(times["direct"], 99)
    g50, g99 = _pct(times["gateway"], 50), _pct(times["gateway"], 99)
    print(f"\nA tool call, one at a time ({len(times['direct'])} calls each way, {args.rounds} alternating rounds)\n")
    print("| way | p50 ms | p99 ms |")
    print("|---|---|---|")
    print(f"| MCP server directly (official client) | {d50:.2f} | {d99:.2f} |")
    print(f"| through llmgw's /mcp (key, rules, record) | {g50:.2f} | {g99:.2f} |")
    print(f"| added by the gateway | +{g50 - d50:.2f} | +{g99 - d99:.2f} |")


if __name__ == "__main__":
    main()
