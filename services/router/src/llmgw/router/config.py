"""The router's settings: one Struct, from file, environment and flags (`llmgw.bus.load_config`)."""

from __future__ import annotations

from typing import Literal

from llmgw.bus import ADMIN_PORTS, BusConfig
from llmgw.proto.people import LdapSettings, OidcSettings
from llmgw.router.routing.balance import REQUEST_CHARS

__all__ = ["RouterConfig"]


class RouterConfig(BusConfig, kw_only=True):
    """Router settings.

    While NATS is away (or the limit counters do not answer within 2 s), the router keeps
    serving: keys, projects, models and replicas from the tables it last followed, and keys
    with limits are admitted by the last counts it read plus its own, counted here (requests,
    tokens held and used, requests in flight) and written to the shared counters once NATS is
    back. Limits then hold for what this router serves; what other routers served meanwhile is
    not seen until then. No request waits on NATS for its limits, none gets a 500 for it, and
    no key is left locked: each router's in-flight entry is written from its own count, and
    one not refreshed for 60 s no longer counts.
    """

    admin_port: int = ADMIN_PORTS["router"]

    http_host: str = "127.0.0.1"
    http_port: int = 8080
    """Port of the OpenAI endpoint; 0 picks a free one."""
    listen_fd: int = -1
    """A listening socket its supervisor (`llmgw up`, `llmgw node join`) made and handed over, by
    descriptor: the router accepts on it instead of binding http_host:http_port, so connections
    waiting on it are taken by the next router (an upgrade's, or one started again) and none is
    refused. -1: bind its own."""
    engine_secret: str = ""
    """File with the secret engines' keys are worked out from (the fleet's: the router reaches
    every engine; `llmgw up` and `llmgw access write` make it); empty: keys anyone who reads a
    replica's id can work out, for one machine with its engines on the loopback only. See
    llmgw.bus.EngineKeys."""
    upstream_timeout_s: float = 600.0
    """Longest an engine may take to answer (the whole answer)."""
    first_byte_timeout_s: float = 60.0
    """Longest an engine may take to start a stream (its prompt read), and then to send each
    next piece of it: past it the try fails and, where nothing was sent yet, another replica is
    tried. A whole (not streamed) answer comes in one piece at its end: the health probe, not
    this, cuts it where its engine stops answering."""
    health_every_s: float = 1.5
    """How often each ready replica's engine is asked for /health (and at once after a request
    on it failed). A probe that fails takes the replica out of rotation; one that answers
    brings it back: a frozen engine is out within `health_every_s + health_timeout_s`."""
    health_timeout_s: float = 2.0
    """How long an engine has to answer its health probe."""
    max_body_bytes: int = 4 * 2**20
    """Larger request bodies get 413 before they are read whole."""
    client_header_timeout_s: float = 10.0
    """Longest a request's line and headers may take to arrive, from its first byte (408 past it,
    then closed: nginx's client_header_timeout)."""
    client_body_timeout_s: float = 10.0
    """Longest a request's body may go without a byte arriving (408 past it: nginx's
    client_body_timeout)."""
    client_body_total_s: float = 60.0
    """Longest a request's body may take to arrive whole, however it trickles (408 past it)."""
    client_send_timeout_s: float = 60.0
    """Longest a client may leave its answer unread (the router's send buffer full) before its
    connection is closed (nginx's send_timeout)."""
    max_connections: int = 0
    """Most client connections held at once; past it a newcomer sheds the longest idle one (or,
    with every one being answered, gets 503). 0: a third of the descriptors the process may open,
    less a reserve for NATS and probes (a request answered holds two, its engine's and its own; a
    connection handed to the admin API and console three, uvicorn being in this process)."""
    max_connections_per_client: int = 512
    """Most connections from one client address; past it that address's longest idle one is
    shed (behind a load balancer every client shares its address: raise this)."""
    max_n: int = 4
    """Most choices (`n`) one request may ask for."""
    max_prompts: int = 16
    """Most prompts one `/v1/completions` request may hold (a list of strings)."""
    replace_wait_s: float = 30.0
    """Longest a request waits for a replica being started or replaced when its model has none
    ready (its engine died, its node was lost), instead of a 503 at once."""
    wake_timeout_s: float = 180.0
    """How long a request for an on-demand model at zero waits for it to wake."""
    demand_every_s: float = 5.0
    """How often, at most, the router tells the scheduler a running on-demand model is in use."""
    request_chars: int = REQUEST_CHARS
    """What a request in flight weighs, besides the prompt it reads, when a replica is chosen by
    its queued work and what of the prompt it holds (in prompt characters: 256, about 64 tokens),
    until its engine's timings say (llama-server's: their fixed part over their rate)."""
    index_blocks: int = 65536
    """Prompt blocks remembered per replica for prefix affinity (least recently used go first)."""
    usage_days: int = 90
    """How long the usage stream keeps each request."""
    usage_summing: Literal["process", "inline", "off"] = "process"
    """Where the usage stream is summed into slots (what reports read): in a process of its own at
    idle priority (`summing.py`), on the router's own loop (one process: tests), or not by this
    router (another sums: every router summing writes the same slots)."""
    tokenize_timeout_s: float = 5.0
    """How long a replica with KV events has to tokenize a prompt before the router routes
    without it (by its own prefix index)."""
    console_session_s: int = 8 * 3600
    """How long a web console session lasts after signing in (/console; sessions are signed with
    a secret derived from `engine_secret`, so every router of a fleet accepts them)."""
    ldap: LdapSettings | None = None
    """Sign-in with an LDAP directory or Active Directory (its `[ldap]` table in the config file;
    docs/people.md): users not made here sign in with it, their groups mapped to tenants.
    Settings an admin keeps (console, `llmgw ctl signin`) win over it."""
    oidc: OidcSettings | None = None
    """Sign-in with an OpenID Connect provider (its `[oidc]` table; docs/people.md)."""
    hook_tries: int = 6
    """How often a webhook is tried with a notice before it is a dead letter."""
    hook_first_wait_s: float = 2.0
    """The wait after a webhook's first failed try; each next one doubles it."""
    hook_timeout_s: float = 10.0
    """How long a webhook has to answer one try."""
    notify_every_s: float = 2.0
    """How often models' states and nodes' health are looked at for notices."""
    drain_s: float = 10.0
    """At a stop, how long the requests in flight may take to finish before they are cut (new
    ones are refused from the start of the stop)."""
