"""Serving a mirrored file: the serve plan's question and answer, and the request that serves it
(the catalog's `serve.plan` and `serve.model`; `llmgw.proto.catalog` names them too)."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

from llmgw.proto._types import NameOrEmpty, NonNegative, Positive, Source

__all__ = ["ServeModel", "ServePlan", "ServePlanAsk", "ServeWay"]


class ServePlanAsk(Struct, kw_only=True):
    """Every way a mirrored file can run on the fleet as it is now."""

    source: Source
    """The file as the mirror holds it ('OWNER/REPO@COMMIT/FILE')."""
    context: NonNegative = 0
    """Context in tokens, shared by the slots; 0: the model's trained context, at most 8192
    (4096 when the file does not say)."""
    cores: NonNegative = 0
    """Threads a CPU replica gets; 0: half a node's cores."""
    slots: Positive = 2
    """Requests one replica serves at once (llama-server -np)."""
    judge: bool = False
    """For a guardrail judge: the ways ordered by how soon a verdict comes (`ServeWay.verdict_s`),
    those within the bound first."""


class ServeWay(Struct, kw_only=True):
    """One way to run the file: where, the memory it needs, where it fits, how fast it answers."""

    kind: Literal["cpu", "gpu", "multi-gpu", "across-nodes"]
    cards: NonNegative = 0
    """Cards one replica takes (0 on the CPU)."""
    card_class: str = ""
    """Their class ("h100-80g"); empty on the CPU."""
    threads: NonNegative = 0
    """CPU threads (on the CPU; on each node, across nodes)."""
    nodes: Positive = 1
    """Nodes one replica spans (across nodes: its layers split, llama.cpp's RPC workers on all but one)."""
    memory_mb: NonNegative = 0
    """Memory one replica needs: host RAM on the CPU (on each node, across nodes), per card on cards."""
    weights_mb: NonNegative = 0
    kv_mb: NonNegative = 0
    """The KV cache for the context and slots."""
    buffers_mb: NonNegative = 0
    """Compute buffers and a margin."""
    experts_on_cpu: NonNegative = 0
    """On cards, a model of experts: the layers whose experts stay in host memory and run on the
    CPU (llama.cpp's --n-cpu-moe), the fewest that let the rest fit the card; 0: all on the cards."""
    host_mb: NonNegative = 0
    """Host memory those experts take beside the cards, MiB."""
    node: str = ""
    """The node its speed was reckoned on (the fastest where it fits now, if any)."""
    nodes_fit: list[str] = field(default_factory=list)
    """Nodes where it fits now."""
    more_replicas: NonNegative = 0
    """Replicas of it that fit now, over those nodes."""
    tokens_per_s: float = 0.0
    """About how many tokens a second one reply gets; 0: unknown (no measured memory rate)."""
    mark: Literal["", "slow", "very slow"] = ""
    """Slow: under 15 tokens a second; very slow: under 5."""
    reply_500_s: float = 0.0
    """Seconds a reply of 500 tokens takes at that speed (0: unknown)."""
    on_purpose: bool = False
    """Serving this way alone takes `cpu_anyway` (the CPU chosen on purpose): a CPU way under 5
    tokens a second, or the CPU while cards that fit are free. The catalog refuses it without."""
    calibrated: bool = False
    """The speed comes from the node's own calibration (`llmgw plan calibrate`), not the defaults."""
    prefill_tokens_per_s: float = 0.0
    """About how many tokens of a prompt it reads a second (compute-bound); 0: unknown."""
    verdict_s: float = 0.0
    """Seconds a judge's verdict takes this way: a 256-token prompt read, 8 tokens written (0: unknown)."""


class ServePlan(Struct, kw_only=True):
    """The ways a file can run on the fleet, best first."""

    source: str
    context: NonNegative
    """The context the ways were sized for."""
    trained_context: NonNegative = 0
    """What the model was trained for (0: the file does not say)."""
    slots: Positive = 2
    ways: list[ServeWay] = field(default_factory=list)
    """Best first: fits now, then fastest, then fewest cards."""
    warnings: list[str] = field(default_factory=list)


class ServeModel(Struct, kw_only=True):
    """Put a mirrored file into service the way asked (or the plan's best): a model in the catalog."""

    source: Source
    name: NameOrEmpty = ""
    """The model's name; empty: from the file's name."""
    cpu: bool = False
    """A profile on the CPU (below the cards' when `gpus` is given too)."""
    gpus: NonNegative = 0
    """A profile on this many cards a replica."""
    cores: NonNegative = 0
    """Threads of the CPU profile; 0: half a node's."""
    context: NonNegative = 0
    """As the plan takes it."""
    slots: Positive = 2
    replicas: dict[str, NonNegative] | str = field(default_factory=dict)
    """Replicas per profile ('gpu', 'cpu'), as a map or as 'gpu=7,cpu=4'; empty: one replica,
    on the best profile that fits."""
    cpu_anyway: bool = False
    """The CPU is chosen on purpose: taken even when very slow, or while cards that fit are free."""
    judge: bool = False
    """Served as a guardrail judge: it reads a prompt and writes a few tokens, so a CPU way is not
    refused for being very slow at writing (what it reads is what counts)."""
    by: str = ""
    """Who is serving it (recorded)."""
