"""What a node is, as its agent reports it: CPUs, memory and its bandwidth, cards, disks."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

from llmgw.proto._types import Name, NonNegative, Positive

__all__ = ["FLEET_SEEN_S", "CpuCalibration", "Filesystem", "FleetMember", "GpuInfo", "NodeInfo", "disk_nearly_full"]

FLEET_SEEN_S = 60.0
"""How often a fleet member writes its entry again; one not written for three times this has left."""


class FleetMember(Struct, kw_only=True):
    """A machine of the fleet as the `fleet` bucket keeps it (`node.<name>`, written by that
    node's agent only; `router.<instance>`, by that router): where it is, so that each node's
    firewall lets in the fleet and nobody else."""

    role: Literal["node", "router"]
    name: str
    address: str
    seen: float


class CpuCalibration(Struct, kw_only=True):
    """How a node's threads read model weights: the constants of the CPU speed estimate.

    The defaults were fitted on another fleet (llama-bench against measured bandwidth);
    `llmgw plan calibrate` fits a node's own and the agent reports them.
    """

    core_share: float = 0.95
    """A thread reads this share of one core's measured rate ..."""
    thread_exp: float = 0.9
    """... times threads to this power (each added thread adds a little less)."""
    read_share: float = 0.68
    """Share of the whole machine's rate read, where one core's rate is not known."""
    token_fixed_s: float = 0.005
    """A token's cost that does not grow with the model, seconds."""
    f16_gflops_per_core: float = 12.0
    """Not read any more: `compute_ns_per_byte["F16"]` took its place (kept: the schema only grows)."""
    source: str = "defaults fitted on another fleet"
    """Where the figures come from."""
    worst_error: float = 0.0
    """The fit's largest relative error over what it measured (0 for the defaults)."""
    compute_ns_per_byte: dict[str, float] = field(default_factory=dict)
    """One thread's arithmetic per byte of weights a token reads, nanoseconds, by tensor type
    ("Q4_1": dequantising costs more than reading); "" is the cost of types not listed. Empty:
    no such cost (a calibration from before it was modelled)."""
    layer_sync_s: float = 0.0
    """Seconds a token spends, per layer, with threads waiting for each other (more than one
    thread only): what makes a deep small model scale worse across threads than a shallow one."""
    holdout_error: float = 0.0
    """The fit's largest relative error on models it was not fitted to (each model left out of the
    fit in turn and estimated from the others); 0 where not measured."""
    all_gbs: float = 0.0
    """The machine's memory rate, all cores, GB/s, measured when the constants were fitted: the
    estimate reads at it, not at another measurement's (0: a fit from before, or the defaults:
    the node's measured rate)."""
    core_gbs: float = 0.0
    """The same, one core."""


# gc=False: plain data that is never part of a reference cycle, so the garbage collector need not
# walk the many thousands of these a scheduler's pass over a big fleet holds
class GpuInfo(Struct, kw_only=True, gc=False):
    """One card (or one MIG instance of a card) as NVML reports it."""

    index: NonNegative
    """The card's index (a MIG instance: its card's)."""
    uuid: str
    """GPU-... or, for a MIG instance, MIG-...; what CUDA_VISIBLE_DEVICES takes."""
    name: str
    cls: str
    """The class every service calls it by ("h100-80g", "a100-mig-3g.40gb")."""
    memory_total_mb: NonNegative
    memory_used_mb: NonNegative = 0
    memory_foreign_mb: NonNegative = 0
    """Used by processes that are not this agent's engines."""
    compute_capability: str = ""
    """"9.0" for an H100."""
    mig_parent: str = ""
    """For a MIG instance, the UUID of the card it is carved from."""
    nvlink_peers: list[str] = field(default_factory=list)
    """UUIDs of the cards it reaches over NVLink."""


class Filesystem(Struct, kw_only=True):
    """A filesystem the node keeps weights on."""

    path: str
    total_mb: NonNegative
    free_mb: NonNegative

    @property
    def nearly_full(self) -> bool:
        """Whether it is nearly full (`disk_nearly_full`)."""
        return disk_nearly_full(self.total_mb, self.free_mb)


NEARLY_FULL_SHARE = 0.05
NEARLY_FULL_MB = 1024


def disk_nearly_full(total_mb: float, free_mb: float) -> bool:
    """A disk is nearly full with less than 5% of it or less than 1 GiB free: said before it is
    full (NATS stops storing, usage waits in the routers' spools) so there is time to free some."""
    return free_mb < NEARLY_FULL_SHARE * total_mb or free_mb < NEARLY_FULL_MB


# gc=False: plain data, never part of a reference cycle (see GpuInfo in llmgw.proto.node)
class NodeInfo(Struct, kw_only=True, gc=False):
    """What a node is: sent on registration and in every heartbeat."""

    node: Name
    """The node's id (the agent's name)."""
    hostname: str
    cpus: Positive
    """Logical CPUs."""
    memory_total_mb: NonNegative
    memory_available_mb: NonNegative
    engines: dict[str, str] = field(default_factory=dict)
    """Engines installed here ('llamacpp', 'vllm') and their versions."""
    membw_all_gbs: float | None = None
    """Memory read bandwidth, all cores, GB/s; None until measured."""
    membw_one_gbs: float | None = None
    """Memory read bandwidth, one core, GB/s."""
    cpu_calibration: CpuCalibration | None = None
    """This node's own CPU speed constants, from `llmgw plan calibrate`; None: the defaults."""
    gpus: list[GpuInfo] = field(default_factory=list)
    """Cards, or the MIG instances of a card carved into MIG."""
    driver_version: str = ""
    """NVIDIA driver; empty on a node without one."""
    cpu_flags: list[str] = field(default_factory=list)
    """The CPU features engines care about (avx2, avx512f, amx_tile, ...)."""
    os: str = ""
    """'<id> <version> (<codename>)' from /etc/os-release."""
    arch: str = ""
    filesystems: list[Filesystem] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
