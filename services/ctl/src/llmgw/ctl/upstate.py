"""Where a running `llmgw up` is: the state it writes in its data directory (<data>/up/up.json),
read by `llmgw ctl` to reach it, and where Prometheus finds its services (<data>/up/prometheus.json,
a file-based service discovery file)."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import msgspec

from llmgw.bus import ADMIN_PORTS, BusConfig, free_port, write_whole

__all__ = ["UpState", "admin_ports", "running_up", "this_node", "write_targets", "write_up_state"]


class UpState(msgspec.Struct, kw_only=True):
    """What `llmgw up` says of itself while it runs."""

    base_url: str
    nats_url: str
    pid: int
    metrics: dict[str, str] = msgspec.field(default_factory=dict)
    """Each service's Prometheus endpoint (its admin port's /metrics), by service."""
    join_url: str = ""
    """Where other machines join (`up --listen ADDR`), and the fingerprint of its certificate."""
    join_fingerprint: str = ""


def this_node() -> str:
    """This machine's node name, as its services call it (`BusConfig.node_name`)."""
    return BusConfig().node_name()


def _path(home: Path) -> Path:
    return home / "up" / "up.json"


def _taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return False
    return True


def admin_ports(services: list[str]) -> dict[str, int]:
    """Each service's admin port: its fixed one (ADMIN_PORTS, where Prometheus is pointed) where
    free, else any free one (another `llmgw up` on this machine holds it); kept for its restarts."""
    return {name: free_port() if _taken(ADMIN_PORTS[name]) else ADMIN_PORTS[name] for name in services}


def write_targets(home: Path, ports: dict[str, int], node: str) -> Path:
    """The Prometheus file-based service discovery file (`file_sd_configs: [{files: [PATH]}]`)
    naming each service's admin port on this machine (`ports`), labelled with its service and the
    machine (`host`: this node's name; not `node`, which series of the scheduler's carry for the
    node they are about); its path (<data>/up/prometheus.json)."""
    targets = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"service": name, "host": node}} for name, port in ports.items()
    ]
    write_whole(sd := home / "up" / "prometheus.json", msgspec.json.encode(targets))
    return sd


def write_up_state(home: Path, state: UpState, ports: dict[str, int]) -> Path:
    """Write `state` with where each service's metrics are (`ports`), and the Prometheus file
    naming them (`write_targets`); that file's path."""
    state.metrics = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    write_whole(_path(home), msgspec.json.encode(state))
    return write_targets(home, ports, this_node())


def running_up(home: Path) -> UpState | None:
    """The state of the `llmgw up` running over `home` (None: none is, or its file does not read)."""
    try:
        state = msgspec.json.decode(_path(home).read_bytes(), type=UpState)
        os.kill(state.pid, 0)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return state
