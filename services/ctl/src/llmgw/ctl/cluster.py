"""The fleet's first three machines as one NATS cluster (`llmgw up --listen A1 --ha A2,A3`).

Each of the three runs a cluster member and a router, so the bus, the fleet's state (JetStream,
every bucket and stream kept in three copies) and the gateway live on when one machine is lost.
The members' routes speak mutual TLS: `up` makes the fleet's CA once, signs its own route
certificate, and signs each other member's when it joins (`join`), for its address; the CA's key
never leaves the first machine."""

from __future__ import annotations

import datetime
import ipaddress
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.bus import Cluster, Identity, TlsFiles, write_private

__all__ = [
    "CLUSTER_PORT",
    "HA_SIZE",
    "HaError",
    "MemberPass",
    "check_ha",
    "cluster_for",
    "first_member",
    "issue_route_certificate",
    "joined_members",
    "member_tls",
    "members_url",
    "public_identities",
    "take_member",
    "wait_members",
    "write_member_tls",
]

CLUSTER_PORT = 6222
"""Where each member takes the other members' routes."""
HA_SIZE = 3
"""The HA machines: the first and two more (a majority, two, carries on when one is lost)."""


class HaError(Exception):
    """HA settings that cannot work, said with what to give instead."""


class MemberPass(msgspec.Struct, kw_only=True):
    """What a machine that joins as an HA member is handed beyond an agent's bundle: its route
    certificate (and key) and the CA, the members' addresses, the public half of every identity
    (its server lets in the same ones), and the router's identity and the fleet's engine secret
    (its router works out every engine's key from it)."""

    members: list[str]
    ca_pem: str
    cert_pem: str
    key_pem: str
    identities: list[tuple[str, str, str]]
    """(role, node, public key) of each identity."""
    router_seed: str
    engine_secret: str


def check_ha(listen: str, others: list[str]) -> list[str]:
    """The three members' addresses, this machine's first; HaError where they cannot be."""
    if not others:
        return []
    if listen in ("127.0.0.1", "localhost", "::1"):
        raise HaError("--ha needs --listen ADDR: the other HA machines reach this one at its address")
    if len(others) != HA_SIZE - 1:
        raise HaError(f"--ha names the two other HA machines (A2,A3), not {len(others)}: the members are three")
    members = [listen, *others]
    for address in members:
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise HaError(f"'{address}' is not an IPv4 address: name each HA machine by its IPv4 address") from None
    if len(set(members)) != HA_SIZE:
        raise HaError(f"the HA machines' addresses repeat ({', '.join(members)}): give three different ones")
    return members


def joined_members(home: Path) -> dict[str, str]:
    """The HA members that joined this first machine: address by node."""
    path = home / "cluster" / "members.json"
    return msgspec.json.decode(path.read_bytes(), type=dict[str, str]) if path.exists() else {}


def take_member(home: Path, node: str, address: str, members: list[str]) -> bool:
    """Whether `node` at `address` joins as an HA member (recorded): an HA address no machine
    holds yet. Every other machine joins with its agent alone."""
    held = joined_members(home)
    if address not in members[1:] or address in held.values():
        return False
    held[node] = address
    path = _folder(home) / "members.json"
    part = path.with_suffix(".part")
    part.write_bytes(msgspec.json.encode(held))
    part.replace(path)
    return True


def first_member(home: Path, node: str, listen: str, others: list[str]) -> Cluster | None:
    """The first machine's cluster settings under `up --ha` (its route certificate made once);
    None without HA; HaError where the addresses cannot be."""
    members = check_ha(listen, others)
    if not members:
        return None
    if not (home / "cluster" / "route.pem").exists():
        write_member_tls(home, *issue_route_certificate(home, node, listen))
    return cluster_for(node, listen, members, member_tls(home))


def wait_members(home: Path, others: list[str], tend: Callable[[], None]) -> None:
    """Under `up --ha`, until both other HA machines have joined (the services keep three copies
    of everything, which needs three members); said once, with what to do. `tend` meanwhile."""
    if not others or len(joined_members(home)) >= HA_SIZE - 1:
        return
    print(
        f"llmgw up: waiting for the other HA machines ({', '.join(others)}) to join before the services start: "
        "run `llmgw node invite NAME` here, then the command it prints on each",
        flush=True,
    )
    while len(joined_members(home)) < HA_SIZE - 1:
        tend()
        time.sleep(0.2)


def members_url(members: list[str], nats_port: int) -> str:
    """Every member's client URL, comma-separated (a client moves to another when one is lost)."""
    return ",".join(f"nats://{address}:{nats_port}" for address in members)


def cluster_for(node: str, address: str, members: list[str], tls: TlsFiles) -> Cluster:
    """This member's cluster settings."""
    return Cluster(
        server_name=node,
        host=address,
        port=CLUSTER_PORT,
        routes=tuple(f"{member}:{CLUSTER_PORT}" for member in members),
        tls=tls,
    )


def public_identities(identities: list[Identity]) -> list[tuple[str, str, str]]:
    """What a member's server needs of each identity: no seed."""
    return [(i.role, i.node, i.public) for i in identities]


def _folder(home: Path) -> Path:
    """<home>/cluster, readable by its owner alone (the CA's and the route's keys are in it)."""
    folder = home / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(home: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The fleet's CA (made once, in <home>/cluster/ca.pem and ca.key)."""
    folder = _folder(home)
    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if not cert_path.exists() or not key_path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmgw fleet CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        write_private(key_path, _pem(key).decode())
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def issue_route_certificate(home: Path, node: str, address: str) -> tuple[str, str, str]:
    """A route certificate for member `node` at `address`, signed by the fleet's CA: (CA, its
    certificate, its key), PEM. It serves both ends of a route (server and client)."""
    ca, ca_key = _ca(home)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"llmgw member {node}")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem).decode(), cert.public_bytes(pem).decode(), _pem(key).decode()


def write_member_tls(home: Path, ca_pem: str, cert_pem: str, key_pem: str) -> TlsFiles:
    """The route certificate, its key (0600) and the CA in <home>/cluster: where they are."""
    folder = home / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "ca": ("ca.pem", ca_pem, 0o644),
        "cert": ("route.pem", cert_pem, 0o644),
        "key": ("route.key", key_pem, 0o600),
    }
    for name, text, mode in files.values():
        part = folder / f"{name}.part"
        part.write_text(text)
        part.chmod(mode)
        part.replace(folder / name)
    return member_tls(home)


def member_tls(home: Path) -> TlsFiles:
    """Where this member's route certificate, key and CA are."""
    folder = home / "cluster"
    return TlsFiles(cert=str(folder / "route.pem"), key=str(folder / "route.key"), ca=str(folder / "ca.pem"))
