"""Machines for the tests, made here: Linux network namespaces (`ip netns`, as root), each its own
network stack with its own address on one private link (a bridge in the test's namespace, each
machine joined to it by a veth pair). A command run "on" a machine runs in its namespace
(`ip netns exec`); its loopback is its own, so each machine may use the same fixed ports."""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["Machines"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Machines:
    """`count` machines m1..mN at 10.<net>.0.1.., their namespaces named after this process."""

    made = 0

    def __init__(self, count: int) -> None:
        assert os.geteuid() == 0 and shutil.which("ip"), "the machine tests make network namespaces: run them as root"
        Machines.made += 1
        tag = f"{os.getpid() % 100000}{Machines.made % 10}"  # each set its own names: a last set's may linger
        self.net = 200 + os.getpid() % 50
        self.tag = tag
        self.bridge = f"llb{tag}"
        self.names = [f"llmgw{tag}m{i + 1}" for i in range(count)]
        self.addresses = [f"10.{self.net}.0.{i + 1}" for i in range(count)]
        try:
            self._make()
        except BaseException:  # what was made is not left behind
            self.close()
            raise

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, (ns, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            _ip("netns", "add", ns)
            outside, inside = self._outside(i), f"llv{self.tag}i{i}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("link", "set", inside, "netns", ns)
            self.run(i, "ip", "addr", "add", f"{address}/24", "dev", inside)
            self.run(i, "ip", "link", "set", inside, "up")
            self.run(i, "ip", "link", "set", "lo", "up")

    def _outside(self, machine: int) -> str:
        return f"llv{self.tag}o{machine}"

    def cut(self, machine: int) -> None:
        """Pull machine `machine`'s cable: its link to the others goes down (it keeps running)."""
        _ip("link", "set", self._outside(machine), "down")

    def mend(self, machine: int) -> None:
        """Plug it back in."""
        _ip("link", "set", self._outside(machine), "up")

    def command(self, machine: int, *args: str) -> list[str]:
        """`args` as run on machine `machine` (0-based)."""
        return ["ip", "netns", "exec", self.names[machine], *args]

    def run(self, machine: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `args` on machine `machine` to its end."""
        return subprocess.run(self.command(machine, *args), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        """Remove every namespace and the bridge (their veth pairs go with them, and an outside end
        whose namespace lingers, its processes still ending, is removed by name)."""
        for i, ns in enumerate(self.names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", self._outside(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
