"""`llmgw node invite NAME` (on the first machine, beside its `llmgw up --listen ADDR`) and
`llmgw node join URL TOKEN --fingerprint FP` (on the machine that joins): see `join`."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llmgw.bus import ADMIN_PORTS, address_towards, data_home
from llmgw.ctl.keeper import Backoff
from llmgw.ctl.rollout import Rollout
from llmgw.ctl.supervise import Kept, spawn_service, stop_in_order
from llmgw.ctl.upstate import running_up, write_targets

if TYPE_CHECKING:
    from llmgw.ctl.member import IdentitiesFollower

# join and member (certificates: cryptography's x509) are imported by the commands that use them,
# not by every `llmgw` command and service that builds this parser.

__all__ = ["add_node_parser"]

DRAIN_S = 10.0
"""At a stop, how long the router lets the requests in flight finish."""


def _invite(args: argparse.Namespace) -> int:
    from llmgw.ctl.join import JoinError, invite

    home = data_home(args.data_dir).resolve()
    state = running_up(home)
    if state is None or not state.join_url:
        print(
            f"llmgw node invite: no `llmgw up --listen ADDR` runs over {home}: machines join one that listens "
            "on an address they reach",
            file=sys.stderr,
        )
        return 1
    try:
        token = invite(home, args.name, time.time(), args.ttl_min * 60)
    except JoinError as exc:
        print(f"llmgw node invite: {exc}", file=sys.stderr)
        return 1
    print(f"machine {args.name} may join for {args.ttl_min:g} minutes, once; run this on it:", file=sys.stderr)
    print(f"llmgw node join {state.join_url} {token} --fingerprint {state.join_fingerprint}")
    return 0


def _join(args: argparse.Namespace) -> int:
    from llmgw.ctl.join import JoinError, fetch_bundle, write_bundle
    from llmgw.ctl.member import ROUTER_PORT, start_member

    home = data_home(args.data_dir).resolve()
    for folder in ("logs", "creds"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    address = args.address or address_towards(urlsplit(args.url).hostname or "127.0.0.1")
    try:
        bundle = fetch_bundle(args.url, args.token, args.fingerprint)
    except JoinError as exc:
        print(f"llmgw node join: {exc}", file=sys.stderr)
        return 1
    files = write_bundle(home, bundle)
    nats_url = bundle.nats_url
    kept: dict[str, Kept] = {}
    rollout = Rollout(home)
    tenders: list[IdentitiesFollower | Rollout] = [rollout]
    print(f"llmgw node join: this machine is node {bundle.node} of the fleet at {nats_url}", flush=True)
    print(f"  NATS identity: {files['seed']} (its agent's; it may speak only for {bundle.node})", flush=True)
    print(f"  engine secret: {files['engine']} (engines here take only the fleet's routers' keys)", flush=True)
    print(f"  scheduler key: {files['scheduler']} (the agent acts only on what the scheduler signed)", flush=True)
    if bundle.member:  # one of the three HA machines
        port = urlsplit(nats_url.split(",")[0]).port or 4222
        join = (args.url, args.fingerprint)
        kept, follower = start_member(home, bundle.node, (address, port), bundle.member, join, rollout)
        tenders.append(follower)
        others = ", ".join(a for a in bundle.member.members if a != address)
        print(f"  NATS: a cluster member at {address}:{port}, its routes to {others} over TLS", flush=True)
        print("    (the fleet's state is kept in three copies: it lives on when one HA machine is lost)", flush=True)
        print(f"  router: the OpenAI endpoint on http://{address}:{ROUTER_PORT}/v1, the gateway here too", flush=True)
        nats_url = f"nats://{address}:{port}"
    else:
        print("  left to the HA machines: NATS, the services and the router (they run them)", flush=True)
    print(f"  agent: started, its engines reached at {address} (its log: {home / 'logs' / 'agent.log'})", flush=True)
    extra = ["--node", bundle.node, "--address", address]
    if args.no_firewall:
        extra += ["--firewall", "off"]
        print("  firewall: left out (--no-firewall): engines' ports take whoever reaches this machine", flush=True)
    else:
        print(
            "  firewall: the agent keeps nftables table inet llmgw: engines' and workers' ports open to the fleet's "
            "machines only (they have no authentication of their own; --no-firewall leaves it out)",
            flush=True,
        )
    extra += ["--engine-secret", str(files["engine"]), "--scheduler-key", str(files["scheduler"])]
    port = args.admin_port or ADMIN_PORTS["agent"]

    def start():
        at = rollout.port("agent", port)
        return spawn_service("agent", home, (nats_url, files["seed"]), at, extra, rollout.python("agent"))

    kept["agent"] = Kept("agent", start, home / "logs" / "agent.log", Backoff())
    here = {
        name: rollout.port(name, port if name == "agent" else ADMIN_PORTS[name]) for name in kept if name in ADMIN_PORTS
    }

    def targets() -> Path:  # every service kept here (an HA member's router too), at its admin port now
        return write_targets(home, {name: rollout.ports[name] for name in here}, bundle.node)

    rollout.keep(kept, targets)
    print(f"  metrics: /metrics of {', '.join(here)} here; Prometheus file_sd: {targets()}", flush=True)
    return _keep(kept, tenders)


def _keep(kept: dict[str, Kept], tenders: list[IdentitiesFollower | Rollout]) -> int:
    """Keep what this machine runs (each started again when it dies; `tenders` tended beside)
    until SIGINT or SIGTERM; then stop it in order (the router drained first, the agent's engines
    with it, NATS last)."""
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    while not stopping:
        for process in [*kept.values(), *tenders]:
            process.tend(time.monotonic())
        time.sleep(0.2)
    print(f"llmgw node join: stopping the {', '.join(kept)}", flush=True)
    for tender in tenders:
        if isinstance(tender, Rollout):
            tender.stop()
    stop_in_order(kept, DRAIN_S)
    return 0


def add_node_parser(sub: argparse._SubParsersAction) -> None:
    """`llmgw node invite NAME` and `llmgw node join URL TOKEN --fingerprint FP`."""
    node = sub.add_parser("node", help="machines that join the fleet: invite one here, join it there")
    verbs = node.add_subparsers(dest="verb", required=True)
    made = verbs.add_parser("invite", help="a one-time token for a machine to join (prints its command)")
    made.add_argument("name", metavar="NAME", help="the new machine's node name")
    made.add_argument("--ttl-min", type=float, default=15.0, help="how long the token is good for (default 15)")
    made.add_argument("--data-dir", help="the data directory of the running `llmgw up --listen ADDR`")
    made.set_defaults(run=_invite)
    join = verbs.add_parser("join", help="join the fleet that invited this machine, and keep its agent running")
    join.add_argument("url", metavar="URL", help="the https:// address `llmgw node invite` printed")
    join.add_argument("token", metavar="TOKEN", help="the one-time token it printed")
    join.add_argument("--fingerprint", required=True, help="the first machine's certificate's SHA-256 (printed)")
    join.add_argument("--address", help="where routers reach engines here (default: the way to the first machine)")
    join.add_argument("--admin-port", type=int, default=0, help="the agent's admin and metrics port")
    join.add_argument("--data-dir", help="where this machine keeps its files (default: $LLMGW_HOME or ~/.local/...)")
    join.add_argument("--no-firewall", action="store_true", help="leave this machine's firewall to you")
    join.set_defaults(run=_join)
