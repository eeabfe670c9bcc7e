"""One config Struct per service, read from a TOML file, then environment, then flags."""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from llmgw.proto import plainly

__all__ = ["ADMIN_PORTS", "BusConfig", "ConfigError", "data_home", "load_config"]

ADMIN_PORTS = {"catalog": 9461, "scheduler": 9462, "mirror": 9463, "router": 9464, "agent": 9465}
"""Each service's admin HTTP port unless set: fixed, so Prometheus can be pointed at them."""

C = TypeVar("C", bound="BusConfig")


class ConfigError(Exception):
    """A config file, variable or flag that cannot be used; the message says which."""


def data_home(given: str | None = None) -> Path:
    """The data directory: `given`, else $LLMGW_HOME, else ~/.local/share/llmgw."""
    return Path(given or os.environ.get("LLMGW_HOME") or Path.home() / ".local/share/llmgw")


class BusConfig(msgspec.Struct, kw_only=True):
    """Settings every service has; each service's config extends it."""

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server(s), comma-separated."""
    creds: str = ""
    """This process's NATS credentials (an nkey seed file; `llmgw up` writes one per service under
    <data>/creds/); empty: connect without (a server with authorization refuses it)."""
    tls_ca: str = ""
    """CA file the NATS server's certificate is checked against; empty: plain TCP."""
    node: str = ""
    """This machine's name in llmgw (default: the hostname)."""
    data_dir: str = ""
    """Where the service keeps its files (default: $LLMGW_HOME or ~/.local/share/llmgw)."""
    admin_host: str = "127.0.0.1"
    """Where the admin HTTP port listens: the loopback unless set (its /metrics and /info say
    more than a stranger should read)."""
    admin_port: int = 0
    """Admin HTTP port (/healthz, /readyz, /metrics, /info): each service's config has a fixed one
    (ADMIN_PORTS) for Prometheus to be pointed at; 0 picks a free one (`llmgw up` does, as several
    may run on one machine). Either way nats.micro's INFO of the service says where it is
    (metadata `admin`)."""
    storage_replicas: int = 1
    """Copies JetStream keeps of each bucket and stream this service creates: 3 on a 3-server
    cluster (deploy/), so losing one server loses no catalog, key or usage record."""
    log_level: str = "info"

    def home(self) -> Path:
        """The data directory, resolved."""
        return data_home(self.data_dir)

    def node_name(self) -> str:
        """The node name, safe for subjects."""
        raw = self.node or os.uname().nodename.split(".")[0]
        return "".join(c if c.isalnum() or c in "-_" else "-" for c in raw)[:63]


def load_config(
    cls: type[C], argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, prefix: str = "LLMGW_"
) -> C:
    """Build `cls` from `--config FILE` (TOML), then `LLMGW_<FIELD>` variables, then `--field value` flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    fields = {f.name for f in msgspec.structs.fields(cls)}
    values: dict[str, object] = {}
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: settings are given as --name value")
        key, eq, val = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"flag --{key} needs a value")
            i += 1
            val = argv[i]
        flags[key.replace("-", "_")] = val
        i += 1
    config_file = flags.pop("config", None) or env.get(f"{prefix}CONFIG")
    if config_file:
        try:
            values.update(tomllib.loads(Path(config_file).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
    for name in fields:
        if f"{prefix}{name.upper()}" in env:
            values[name] = env[f"{prefix}{name.upper()}"]
    for key in flags:
        if key not in fields:
            raise ConfigError(f"unknown flag --{key.replace('_', '-')}; known: {', '.join(sorted(fields))}")
    values.update(flags)
    try:
        return msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{cls.__name__}: {plainly(exc, 'the config')}") from None
