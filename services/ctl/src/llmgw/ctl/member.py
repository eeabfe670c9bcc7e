"""A machine that joined as an HA member (`llmgw node join` at one of `up --ha`'s addresses):
its NATS cluster member and its router, beside the agent every joined machine runs."""

from __future__ import annotations

from pathlib import Path

from llmgw.bus import ADMIN_PORTS, Identity, server_config, write_private
from llmgw.ctl.access import engine_secret_file
from llmgw.ctl.cluster import HA_SIZE, MemberPass, cluster_for, write_member_tls
from llmgw.ctl.keeper import Backoff
from llmgw.ctl.supervise import Kept, spawn_nats, spawn_service

__all__ = ["ROUTER_PORT", "start_member"]

ROUTER_PORT = 8080
"""Where each HA member's router answers (every address of the machine)."""


def start_member(home: Path, node: str, address: str, nats_port: int, member: MemberPass) -> dict[str, Kept]:
    """This machine's NATS member (its configuration written as the first machine's is: the same
    identities let in, the cluster's routes over mutual TLS) and its router, started and kept."""
    for folder in ("nats", "creds", "logs"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    tls = write_member_tls(home, member.ca_pem, member.cert_pem, member.key_pem)
    identities = [Identity(role=role, node=n, seed="", public=public) for role, n, public in member.identities]
    conf = home / "nats" / "server.conf"
    cluster = cluster_for(node, address, member.members, tls)
    conf.write_text(server_config(identities, home / "nats", host=address, port=nats_port) + cluster.config())
    conf.chmod(0o600)
    nats = spawn_nats(home, nats_port, conf, address)
    kept = {
        "nats-server": Kept(
            "nats-server",
            lambda: spawn_nats(home, nats_port, conf, address).process,
            home / "nats" / "nats-server.log",
            Backoff(),
            running=nats.process,
        )
    }
    seed = home / "creds" / "router.nk"
    write_private(seed, member.router_seed + "\n")
    secret = engine_secret_file(home / "creds")
    write_private(secret, member.engine_secret)
    extra = ["--http-host", "0.0.0.0", "--http-port", str(ROUTER_PORT), "--engine-secret", str(secret)]
    extra += ["--storage-replicas", str(HA_SIZE)]

    def router():
        return spawn_service("router", home, nats.url, seed, ADMIN_PORTS["router"], extra)

    kept["router"] = Kept("router", router, home / "logs" / "router.log", Backoff())
    return kept
