"""The node's firewall rules, without I/O: the fleet's machines (those that wrote their entry
lately) let in to engines' ports and the admin port, everyone else dropped there (`firewall`
applies them)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from llmgw.proto import FLEET_SEEN_S, FleetMember

__all__ = ["members", "ruleset"]


def _family(address: str) -> int:
    try:
        return ipaddress.ip_network(address, strict=False).version
    except ValueError:
        return 0


def members(entries: Iterable[FleetMember], now: float) -> list[str]:
    """The addresses of the fleet's machines that wrote their entry lately (one silent for three
    times `FLEET_SEEN_S` has left), each once, sorted."""
    return sorted({m.address for m in entries if now - m.seen <= 3 * FLEET_SEEN_S and _family(m.address)})


def _set(name: str, addresses: list[str], version: int) -> list[str]:
    kind = "ipv4_addr" if version == 4 else "ipv6_addr"
    chosen = [a for a in addresses if _family(a) == version]
    elements = f" elements = {{ {', '.join(chosen)} }}" if chosen else ""
    return [f"  set {name}{version} {{ type {kind}; flags interval;{elements} }}"]


def ruleset(ports: tuple[int, int], admin_port: int, fleet: list[str], admin_from: list[str]) -> str:
    """The `inet llmgw` table (replacing the one there): `ports` (engines, workers) from the
    fleet and the loopback only; `admin_port` also from `admin_from`; everything else as it was."""
    low, high = ports
    admins = sorted({*fleet, *admin_from})
    lines = ["table inet llmgw", "delete table inet llmgw", "table inet llmgw {"]
    for version in (4, 6):
        lines += _set("fleet", fleet, version) + _set("admin", admins, version)
    lines += [
        "  chain input {",
        "    type filter hook input priority 0; policy accept;",
        '    iifname "lo" accept',
        f"    tcp dport {low}-{high} ip saddr @fleet4 accept",
        f"    tcp dport {low}-{high} ip6 saddr @fleet6 accept",
        f"    tcp dport {low}-{high} drop",
    ]
    if admin_port:
        lines += [
            f"    tcp dport {admin_port} ip saddr @admin4 accept",
            f"    tcp dport {admin_port} ip6 saddr @admin6 accept",
            f"    tcp dport {admin_port} drop",
        ]
    return "\n".join([*lines, "  }", "}", ""])
