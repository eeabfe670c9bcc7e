"""A machine that joined as an HA member (`llmgw node join` at one of `up --ha`'s addresses):
its NATS cluster member and its router, beside the agent every joined machine runs."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from llmgw.bus import ADMIN_PORTS, Cluster, Identity, server_config, write_private
from llmgw.ctl.access import engine_secret_file
from llmgw.ctl.cluster import HA_SIZE, MemberPass, cluster_for, member_tls, write_member_tls
from llmgw.ctl.join import JoinError, fetch_identities
from llmgw.ctl.keeper import Backoff
from llmgw.ctl.rollout import Rollout
from llmgw.ctl.supervise import Kept, listening, spawn_nats, spawn_service

__all__ = ["ROUTER_PORT", "IdentitiesFollower", "start_member"]

ROUTER_PORT = 8080
"""Where each HA member's router answers (every address of the machine)."""
FOLLOW_S = 10.0
"""How often a member asks the first machine for the identities (a machine that joined since)."""


def _write_conf(home: Path, address: str, port: int, cluster: Cluster, identities: list[tuple[str, str, str]]) -> Path:
    """The member's nats-server configuration: the fleet's identities let in, its cluster block."""
    let_in = [Identity(role=role, node=node, seed="", public=public) for role, node, public in identities]
    conf = home / "nats" / "server.conf"
    part = conf.with_suffix(".part")
    part.write_text(server_config(let_in, home / "nats", host=address, port=port) + cluster.config())
    part.chmod(0o600)
    part.replace(conf)
    return conf


class IdentitiesFollower:
    """Asks the first machine for the fleet's identities every `FOLLOW_S` (with the member's route
    certificate) and, when they changed (a machine joined), writes them into this member's NATS
    configuration and has it reload (SIGHUP): an agent that joined later is let in here too."""

    def __init__(self, home: Path, join: tuple[str, str], nats: Kept, rewrite: Callable, known: list) -> None:
        self.home, self.join, self.nats, self.rewrite = home, join, nats, rewrite
        self.next_at = 0.0
        self.known: list[tuple[str, str, str]] = [tuple(i) for i in known]
        """The identities this member's NATS lets in (the pass's, to begin with)."""

    def tend(self, now: float) -> None:
        """Ask, when due; a first machine that does not answer is asked again next time."""
        if now < self.next_at:
            return
        self.next_at = now + FOLLOW_S
        try:
            got = fetch_identities(*self.join, member_tls(self.home))
            if got != self.known:
                self.rewrite(got)
                self.nats.proc.send_signal(signal.SIGHUP)
        except (JoinError, OSError):  # the first machine away, a file not written: asked again next time
            return
            print(f"llmgw node join: NATS here lets in {len(got)} identities now (a machine joined)", flush=True)
        self.known = got


def start_member(
    home: Path, node: str, listen: tuple[str, int], member: MemberPass, join: tuple[str, str], rollout: Rollout
) -> tuple[dict[str, Kept], IdentitiesFollower]:
    """This machine's NATS member (its configuration written as the first machine's is: the same
    identities let in, the cluster's routes over mutual TLS) and its router, started and kept; and
    what follows the identities from the first machine (at `join`: its URL and fingerprint).
    `listen`: its address and NATS port; `rollout`: the release each process runs."""
    address, nats_port = listen
    for folder in ("nats", "creds", "logs"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    tls = write_member_tls(home, member.ca_pem, member.cert_pem, member.key_pem)
    cluster = cluster_for(node, address, member.members, tls)
    conf = _write_conf(home, address, nats_port, cluster, member.identities)
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
    gateway = listening("0.0.0.0", ROUTER_PORT)  # held here: its routers come and go, it stays
    extra = ["--listen-fd", str(gateway.fileno()), "--engine-secret", str(secret)]
    extra += ["--storage-replicas", str(HA_SIZE)]

    def router(gateway=gateway):  # the socket lives as long as what starts its routers
        port = rollout.port("router", ADMIN_PORTS["router"])
        return spawn_service("router", home, (nats.url, seed), port, extra, rollout.python("router"))

    kept["router"] = Kept("router", router, home / "logs" / "router.log", Backoff())

    def rewrite(identities: list[tuple[str, str, str]]) -> None:
        _write_conf(home, address, nats_port, cluster, identities)

    return kept, IdentitiesFollower(home, join, kept["nats-server"], rewrite, member.identities)
