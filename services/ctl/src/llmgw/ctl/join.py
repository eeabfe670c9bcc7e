"""Machines that join the fleet a first machine's `llmgw up --listen ADDR` runs.

On the first machine `llmgw node invite NAME` makes a one-time token (kept hashed, good for
`TOKEN_S`) and prints the command the new machine runs. `up` answers joins on `ADDR:JOIN_PORT`
over TLS with a certificate it made for itself, whose SHA-256 fingerprint the command carries:
the joining machine checks it before it sends the token, so nothing crosses in the clear and no
other server can take the token. A token taken once is gone; the first machine then makes the
node's NATS identity and engine secret, lets the identity in (NATS reloads its authorization),
and hands them over. `llmgw node join` writes them (0600) and keeps the node's agent running.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import http.server
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.bus import TlsFiles
from llmgw.ctl.access import NODE_NAME, engine_secret_file, scheduler_key_file
from llmgw.ctl.cluster import MemberPass

__all__ = [
    "JOIN_PORT",
    "TOKEN_S",
    "JoinBundle",
    "JoinError",
    "JoinServer",
    "fetch_bundle",
    "fetch_identities",
    "invite",
    "join_certificate",
    "redeem",
    "write_bundle",
]

JOIN_PORT = 9470
"""Where `up --listen ADDR` answers joins (TLS)."""
TOKEN_S = 900.0
"""How long an invitation's token is good for."""
JOIN_WAIT_S = 10.0
"""How long a joining connection may take over its handshake and its request."""


class JoinError(Exception):
    """An invitation or a join that cannot go on, said plainly (never with a token or a secret)."""


class JoinBundle(msgspec.Struct, kw_only=True):
    """What a joining machine is handed: its node's NATS identity and engine secret, the
    scheduler's public key, and where NATS is (each HA member, where there are three); what it
    runs as an HA member where it is one."""

    node: str
    nats_url: str
    agent_seed: str
    engine_secret: str
    scheduler_pub: str
    member: MemberPass | None = None


# -- the first machine -------------------------------------------------------------------------
def _tokens(home: Path) -> Path:
    folder = home / "join" / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invite(home: Path, node: str, now: float, ttl_s: float = TOKEN_S) -> str:
    """A one-time token for machine `node` to join (kept only as its hash); JoinError where the
    name cannot be a node's or is one already (a node joined, or one invited and not yet joined)."""
    if not NODE_NAME.fullmatch(node):
        raise JoinError(f"'{node}' cannot name a node: use letters, digits, '-' and '_' (at most 63)")
    if (home / "creds" / f"agent-{node}.nk").exists():
        raise JoinError(f"there is already a node '{node}' in this fleet: give the new machine another name")
    for pending in _tokens(home).glob("*.json"):
        held = json.loads(pending.read_text())
        if held["expires"] < now:
            pending.unlink(missing_ok=True)
        elif held["node"] == node:
            raise JoinError(f"'{node}' is invited already (until {time.ctime(held['expires'])}): use that token")
    token = f"llmgw-join-{secrets.token_urlsafe(24)}"
    path = _tokens(home) / f"{_digest(token)}.json"
    path.write_text(json.dumps({"node": node, "expires": now + ttl_s}))
    path.chmod(0o600)
    return token


def redeem(home: Path, token: str, now: float) -> str:
    """The node a token invites, the token gone with it (taken by one caller only); JoinError
    where it is unknown, used already, or expired."""
    path = _tokens(home) / f"{_digest(token)}.json"
    taken = path.with_suffix(".taken")
    try:
        path.rename(taken)  # atomic: of two joins with one token, one gets it
    except FileNotFoundError:
        raise JoinError("that join token is not known here, or was used already: ask for a new invitation") from None
    held = json.loads(taken.read_text())
    taken.unlink()
    if held["expires"] < now:
        raise JoinError("that join token has expired: ask for a new invitation (`llmgw node invite`)")
    return held["node"]


def join_certificate(home: Path, address: str) -> tuple[Path, Path, str]:
    """The join server's certificate and key (made once, for `address`) and its SHA-256
    fingerprint, which invitations carry."""
    folder = home / "join"
    cert, key = folder / "tls.pem", folder / "tls.key"
    if not cert.exists() or not key.exists():
        now = datetime.datetime.now(datetime.UTC)
        private = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"llmgw join {address}")])
        made = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(private, hashes.SHA256())
        )
        folder.mkdir(parents=True, exist_ok=True)
        key.write_bytes(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key.chmod(0o600)
        cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    return cert, key, hashlib.sha256(der).hexdigest()


class _TlsServer(http.server.ThreadingHTTPServer):
    """An HTTP server whose connections each shake hands for TLS in their own thread, within
    `JOIN_WAIT_S`: a client that connects and sends nothing holds up no other (a handshake on the
    listening socket would stop every accept behind it)."""

    daemon_threads = True
    context: ssl.SSLContext

    def finish_request(self, request, client_address) -> None:
        request.settimeout(JOIN_WAIT_S)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:  # ssl.SSLError among them: no handshake, no request
            return
        self.RequestHandlerClass(tls, client_address, self)


Admit = Callable[[str, str], MemberPass | None]
"""Lets node `node` at `address` in (its identity made, NATS told); what it runs as an HA member."""


class JoinServer:
    """Answers `POST /v1/join {"token": ..., "address": ...}` over TLS on `address:port` with the
    JoinBundle of the node the token invites (`admit` makes it and lets it in), in a thread of its
    own."""

    def __init__(self, home: Path, address: str, port: int, nats_url: str, admit: Admit) -> None:
        self.home, self.nats_url, self.admit = home, nats_url, admit
        cert, key, self.fingerprint = join_certificate(home, address)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        if (ca := home / "cluster" / "ca.pem").exists():  # HA members show their route certificate
            context.load_verify_locations(ca)
            context.verify_mode = ssl.CERT_OPTIONAL
        self.lock = threading.Lock()
        """One join (or identities' reading) at a time: each writes the credentials and NATS's file."""
        self.identities: Callable[[], list[tuple[str, str, str]]] = list
        """Every identity's public half, for the HA members' NATS (`GET /v1/identities`)."""
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = JOIN_WAIT_S  # a client that sends slowly lets go of its thread after this

            def do_POST(self) -> None:
                raw = self.rfile.read(min(int(self.headers["content-length"] or 0), 4096))
                status, body = server.answer(self.path, raw, self.client_address[0])
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                member = isinstance(self.connection, ssl.SSLSocket) and self.connection.getpeercert()
                if self.path != "/v1/identities" or not member:
                    self.send_error(404 if member else 403)
                    return
                with server.lock:
                    body = msgspec.json.encode(server.identities())
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:  # its lines would carry no more than `up` says
                pass

        self.httpd = _TlsServer((address, port), Handler)
        self.httpd.context = context
        self.url = f"https://{address}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="join-server", daemon=True)

    def answer(self, path: str, raw: bytes, peer: str) -> tuple[int, bytes]:
        """The answer to one join from `peer` (the address it connects from, which decides whether
        it is an HA member: never what it says of itself): 200 and the bundle, or 4xx and why."""
        if path != "/v1/join":
            return 404, b'{"error": "no such path: joins are POST /v1/join"}'
        try:
            token = str(json.loads(raw)["token"])
            with self.lock:
                node = redeem(self.home, token, time.time())
                member = self.admit(node, peer)
        except (ValueError, KeyError, TypeError):
            return 400, b'{"error": "a join is {\\"token\\": \\"...\\"}"}'
        except JoinError as exc:
            return 403, json.dumps({"error": str(exc)}).encode()
        role = "an HA member: NATS, a router and an agent" if member else "its agent"
        print(f"llmgw up: machine {node} joined as {role}; it may now sign in to NATS", flush=True)
        creds = self.home / "creds"
        bundle = JoinBundle(
            node=node,
            nats_url=self.nats_url,
            agent_seed=(creds / f"agent-{node}.nk").read_text(),
            engine_secret=engine_secret_file(creds, node).read_text(),
            scheduler_pub=scheduler_key_file(creds).read_text(),
            member=member,
        )
        return 200, msgspec.json.encode(bundle)

    def start(self) -> JoinServer:
        """Start answering."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering."""
        self.httpd.shutdown()
        self.httpd.server_close()


# -- the joining machine -----------------------------------------------------------------------
def _pinned(url: str, fingerprint: str, timeout: float, client: TlsFiles | None = None) -> http.client.HTTPSConnection:
    """A TLS connection to `url` whose certificate is the one `fingerprint` names (JoinError
    before anything is sent where it is not), showing `client`'s certificate where given."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise JoinError(f"{url} is not the https:// address `llmgw node invite` printed")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # pinned below instead
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    conn = http.client.HTTPSConnection(parts.hostname, parts.port or JOIN_PORT, timeout=timeout, context=context)
    try:
        conn.connect()
    except OSError as exc:
        raise JoinError(f"{url} did not answer ({exc})") from None
    seen = hashlib.sha256(conn.sock.getpeercert(binary_form=True) or b"").hexdigest()
    if seen != fingerprint.lower().replace(":", ""):
        conn.close()
        raise JoinError(
            f"{url} is not the machine that invited this one (its certificate's fingerprint is {seen}): "
            "nothing was sent; check the address"
        )
    return conn


def fetch_bundle(url: str, token: str, fingerprint: str, timeout: float = 30.0) -> JoinBundle:
    """The bundle the first machine hands over for `token`, asked over TLS only once its
    certificate is the one `fingerprint` names (the token is not sent otherwise); JoinError
    saying what went wrong."""
    conn = _pinned(url, fingerprint, timeout)
    try:
        conn.request("POST", "/v1/join", json.dumps({"token": token}), {"content-type": "application/json"})
        answer = conn.getresponse()
        body = answer.read()
    except OSError as exc:
        raise JoinError(f"{url} did not answer ({exc})") from None
    finally:
        conn.close()
    if answer.status != 200:
        said = json.loads(body).get("error", "") if body.startswith(b"{") else body[:200].decode(errors="replace")
        raise JoinError(f"the first machine refused: {said}")
    return msgspec.json.decode(body, type=JoinBundle)


def fetch_identities(url: str, fingerprint: str, route: TlsFiles, timeout: float = 3.0) -> list[tuple[str, str, str]]:
    """Every identity's public half, from the first machine (an HA member asks with its route
    certificate); JoinError, whatever went wrong (a member's supervisor asks again later)."""
    conn = _pinned(url, fingerprint, timeout, route)
    try:
        conn.request("GET", "/v1/identities")
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise JoinError(f"the first machine would not give the identities ({answer.status})")
        return [tuple(i) for i in msgspec.json.decode(body, type=list[tuple[str, str, str]])]
    except (OSError, http.client.HTTPException, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise JoinError(f"{url} gave no identities ({exc})") from None
    finally:
        conn.close()


def write_bundle(home: Path, bundle: JoinBundle) -> dict[str, Path]:
    """The bundle's files in `home`/creds (0600; the scheduler's public key 0644): where each is."""
    creds = home / "creds"
    creds.mkdir(parents=True, exist_ok=True)
    creds.chmod(0o700)
    files = {
        "seed": (creds / f"agent-{bundle.node}.nk", bundle.agent_seed, 0o600),
        "engine": (engine_secret_file(creds, bundle.node), bundle.engine_secret, 0o600),
        "scheduler": (scheduler_key_file(creds), bundle.scheduler_pub, 0o644),
    }
    for path, text, mode in files.values():
        part = path.with_suffix(".part")
        part.write_text(text)
        part.chmod(mode)
        part.replace(path)
    return {name: path for name, (path, _, _) in files.items()}
