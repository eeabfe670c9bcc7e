"""Where each machine of the fleet is: every agent and router writes its own entry in the
`fleet` bucket (`FleetMember`) every `FLEET_SEEN_S`; the nodes' firewalls let in those."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import msgspec
from nats.js import JetStreamContext

from llmgw.bus._nats import address_towards, kv_bucket
from llmgw.proto import BUCKETS, FLEET_SEEN_S, FleetMember

__all__ = ["announce", "nats_host"]


def nats_host(url: str) -> str:
    """The host of the first NATS server in `url` (a comma-separated list)."""
    return urlsplit(url.split(",")[0].strip()).hostname or "127.0.0.1"


async def announce(js: JetStreamContext, role: str, name: str, address: str = "", nats_url: str = "") -> None:
    """Write this machine's entry (`<role>.<name>`) now and every `FLEET_SEEN_S` after, until
    cancelled; its address the one given, else the one on the way to NATS."""
    kv = await kv_bucket(js, BUCKETS["fleet"])
    where = address or address_towards(nats_host(nats_url))
    while True:
        member = FleetMember(role=role, name=name, address=where, seen=time.time())  # type: ignore[arg-type]
        await kv.put(f"{role}.{name}", msgspec.json.encode(member))
        await asyncio.sleep(FLEET_SEEN_S)
