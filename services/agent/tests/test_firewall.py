"""The firewall's rules: the fleet's machines (those that wrote their entry lately) let in to the
engines' ports and the admin port, everyone else dropped there, and the rules nftables takes
(checked by `nft -c`, which applies nothing)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from llmgw.agent.firewall_rules import members, ruleset
from llmgw.proto import FLEET_SEEN_S, FleetMember


def _member(name: str, address: str, seen: float) -> FleetMember:
    return FleetMember(role="node", name=name, address=address, seen=seen)


def test_a_machine_silent_for_three_rounds_has_left_and_bad_addresses_are_left_out():
    now = 10_000.0
    fleet = [
        _member("a", "10.0.0.1", now),
        _member("b", "10.0.0.2", now - 3 * FLEET_SEEN_S - 1),
        _member("c", "fd00::3", now - 1),
        _member("d", "not an address", now),
        _member("e", "10.0.0.1", now),
    ]
    assert members(fleet, now) == ["10.0.0.1", "fd00::3"]


def test_the_rules_let_the_fleet_in_and_drop_the_rest_on_those_ports_only():
    rules = ruleset((20000, 29999), 9465, ["10.0.0.1", "fd00::3"], ["192.168.7.0/24"])
    assert "set fleet4 { type ipv4_addr; flags interval; elements = { 10.0.0.1 } }" in rules
    assert "set admin4 { type ipv4_addr; flags interval; elements = { 10.0.0.1, 192.168.7.0/24 } }" in rules
    assert "tcp dport 20000-29999 ip saddr @fleet4 accept" in rules and "tcp dport 20000-29999 drop" in rules
    assert "tcp dport 9465 drop" in rules and "policy accept" in rules
    assert rules.startswith("table inet llmgw\ndelete table inet llmgw\n")  # replaces only its own table


@pytest.mark.parametrize("fleet", [["10.0.0.1", "fd00::3"], []], ids=["a fleet", "nobody yet"])
def test_nftables_takes_the_rules(fleet):
    nft = shutil.which("nft")
    assert nft, "nftables is missing: ./dev installs it (apt-get install nftables)"
    checked = subprocess.run(
        [nft, "-c", "-f", "-"], input=ruleset((20000, 29999), 9465, fleet, []), text=True, capture_output=True
    )
    assert checked.returncode == 0, checked.stderr
