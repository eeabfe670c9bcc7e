"""Tokens a second of one reply: on CPUs from how fast memory reads and how much arithmetic the
weights' types take, on cards from their bandwidth.

Writing a token reads every weight it uses once, so memory decides much of the speed. On a CPU
the rate is what a replica's threads read: each about one core's measured rate, a little less
per added thread, never more than the whole machine's. A quantised weight must be unpacked
before it is multiplied, and on a CPU that arithmetic costs as much as the reading (Q4_1: more):
each tensor type has its own cost per byte, which the threads share. On a card it is the card's
bandwidth at an efficiency, with tensor parallelism adding cards' bandwidth sublinearly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from llmgw.proto import CpuCalibration

__all__ = [
    "CARDS",
    "CPU_PREFILL_GFLOPS",
    "DEFAULT_CPU",
    "GPU_PREFILL_EFFICIENCY",
    "JUDGE_ANSWER_TOKENS",
    "JUDGE_BOUND_S",
    "JUDGE_PROMPT_TOKENS",
    "SLOW_TPS",
    "VERY_SLOW_TPS",
    "Card",
    "GpuConstants",
    "calibrated_rates",
    "card_class",
    "card_of",
    "cpu_compute_seconds",
    "cpu_read_gbs",
    "cpu_threads",
    "cpu_token_costs",
    "cpu_tokens_at",
    "cpu_tokens_per_second",
    "gpu_tokens_per_second",
    "prefill_tokens_per_second",
    "speed_note",
    "verdict_seconds",
]

DEFAULT_CPU = CpuCalibration(
    token_fixed_s=0.00062,
    layer_sync_s=0.0000826,
    compute_ns_per_byte={
        "F32": 0.0,
        "F16": 0.00269,
        "Q8_0": 0.01975,
        "Q4_0": 0.05434,
        "Q4_1": 0.09852,
        "Q5_0": 0.2013,
        "Q4_K": 0.08107,
        "Q5_K": 0.14968,
        "Q6_K": 0.05743,
        "": 0.00387,
    },
    worst_error=0.0786,
    source="defaults: llama-bench on another fleet (Q4_K_M, 8 and 4 vCPUs), on a 2-core AMD EPYC VM "
    "(generated F32, F16, Q8_0, Q4_0, Q4_1 models; 2026-12-03) and on a 2-core Intel Xeon VM (generated "
    "Q5_0, Q4_K, Q5_K, Q6_K models; 2026-12-07)",
)
"""The CPU constants where a node has none of its own. Memory: 0.95 of one core's rate times
threads^0.9, up to the machine's (0.68 of the machine's where one core's rate is unknown),
fitted on another fleet. The arithmetic per byte of F32, F16, Q8_0, Q4_0 and Q4_1, the fixed
cost a token and the threads' wait a layer: fitted to both machines' figures at once (worst
error 8%; SmolLM2 Q4_1, left out, within 5%). Q5_0, Q4_K, Q5_K and Q6_K (what Q4_K_M and Q5_K_M
files hold beside Q8_0): fitted on a third machine with every other constant held, 1 and 2
threads, 256 MiB models; that machine's Q8_0 and Q4_1 cost 1.2 to 2.9 times these defaults, so
these are if anything high. Types measured on no machine take the "" cost, which the other
fleet's Q4_K_M figures set: close to none, that fleet was memory-bound."""

SLOW_TPS = 15.0
"""Under this a reply is a wait somebody notices."""
VERY_SLOW_TPS = 5.0
"""Under this a reply of a few hundred tokens takes minutes."""


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """A card model's memory bandwidth, from its maker's datasheet, and its dense FP16/BF16 tensor
    TFLOPS (without sparsity), which a prompt's reading (prefill) is bound by."""

    bandwidth_gbs: float
    memory_gb: int
    tflops: float = 0.0


CARDS: dict[str, Card] = {
    # NVIDIA datasheets (GB/s of HBM or GDDR, as published).
    "b200": Card(bandwidth_gbs=8000, memory_gb=180, tflops=2250),
    "h200": Card(bandwidth_gbs=4800, memory_gb=141, tflops=989),
    "h100-nvl": Card(bandwidth_gbs=3900, memory_gb=94, tflops=835),
    "h100": Card(bandwidth_gbs=3350, memory_gb=80, tflops=989),  # SXM5
    "h100-pcie": Card(bandwidth_gbs=2000, memory_gb=80, tflops=756),
    "gh200": Card(bandwidth_gbs=4000, memory_gb=96, tflops=989),
    "a100": Card(bandwidth_gbs=2039, memory_gb=80, tflops=312),  # 80 GB SXM; the 40 GB card below
    "a100-40g": Card(bandwidth_gbs=1555, memory_gb=40, tflops=312),
    "l40s": Card(bandwidth_gbs=864, memory_gb=48, tflops=362),
    "l40": Card(bandwidth_gbs=864, memory_gb=48, tflops=181),
    "rtx6000ada": Card(bandwidth_gbs=960, memory_gb=48, tflops=364),
    "a6000": Card(bandwidth_gbs=768, memory_gb=48, tflops=155),
    "a40": Card(bandwidth_gbs=696, memory_gb=48, tflops=150),
    "rtx4090": Card(bandwidth_gbs=1008, memory_gb=24, tflops=165),
    "rtx3090": Card(bandwidth_gbs=936, memory_gb=24, tflops=71),
    "a10": Card(bandwidth_gbs=600, memory_gb=24, tflops=125),
    "l4": Card(bandwidth_gbs=300, memory_gb=24, tflops=121),
    "v100": Card(bandwidth_gbs=900, memory_gb=32, tflops=125),
    "t4": Card(bandwidth_gbs=320, memory_gb=16, tflops=65),
}
"""Card models by the family part of their class; `card_of` looks a class up."""

_SIZES_GB = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 180, 192)
_MIG = re.compile(r"\bmig\s+(\d+g\.\d+gb)\b")
_FAMILY = re.compile(r"\b(b200|gh200|h200|h100|a100|l40s|l40|a6000|a40|a10|l4|v100|t4|rtx\s?(?:6000 ada|4090|3090))\b")


def card_class(name: str, memory_mb: int) -> str:
    """The class every service calls a card by: family, variant, memory ("h100-80g", "l40s-48g").

    Memory is snapped to the marketed size (an 80 GB card reports about 79.6 GiB). A MIG
    instance is its family and MIG profile ("a100-mig-3g.40gb").
    """
    low = name.lower().replace("nvidia", "").replace("geforce", "")
    m = _FAMILY.search(low)
    family = re.sub(r"[\s-]", "", m.group(1)) if m else re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "gpu"
    mig = _MIG.search(low)
    if mig:
        return f"{family}-mig-{mig.group(1)}"
    variant = "-nvl" if " nvl" in low else ("-pcie" if "pcie" in low and family == "h100" else "")
    gib = memory_mb / 1024
    size = min(_SIZES_GB, key=lambda s: abs(s - gib))
    gb = size if abs(size - gib) <= 0.1 * size else round(gib)
    return f"{family}{variant}-{gb}g"


def card_of(cls: str) -> Card | None:
    """The card of a class ("a100-40g" is its own entry; "h100-80g" is "h100"), or None.

    A MIG instance ("a100-mig-3g.40gb") gets its slices' share of the card's bandwidth and
    arithmetic: 3 of 7.
    """
    family, _, mig = cls.partition("-mig-")
    if mig:
        card, m = CARDS.get(family), re.match(r"(\d+)g\.(\d+)gb", mig)
        if card is None or m is None:
            return None
        slices = int(m.group(1))
        return Card(
            bandwidth_gbs=card.bandwidth_gbs * slices / 7, memory_gb=int(m.group(2)), tflops=card.tflops * slices / 7
        )
    if cls in CARDS:
        return CARDS[cls]
    return CARDS.get(cls.rsplit("-", 1)[0])


def cpu_threads(cpu_cores: int | None, node_cpus: int) -> int:
    """Threads a CPU replica runs: the cores its profile reserves, else half the node's."""
    if cpu_cores:
        return cpu_cores
    return max(node_cpus // 2, 1)


CALIBRATED_RATES_WITHIN = 2.0
"""A calibration's own memory rates stand for the node's while the node's measured all-core rate
is within this factor of them (a shared VM's readings of one machine spread by up to 1.6x);
further off, it is another machine (copied there, resized) and the node's rate is read."""


def calibrated_rates(all_gbs: float, core_gbs: float | None, k: CpuCalibration) -> tuple[float, float | None]:
    """The memory rates a CPU estimate reads at: a calibration's own (its constants turn those into
    what llama-bench measured, and another moment's reading differs more than tokens a second
    do), unless the node's measured rate says it is another machine; else the node's."""
    if k.all_gbs <= 0:
        return all_gbs, core_gbs
    if all_gbs and all_gbs > 0 and not 1 / CALIBRATED_RATES_WITHIN <= all_gbs / k.all_gbs <= CALIBRATED_RATES_WITHIN:
        return all_gbs, core_gbs
    return k.all_gbs, k.core_gbs


def cpu_read_gbs(all_gbs: float, core_gbs: float | None, threads: int, k: CpuCalibration = DEFAULT_CPU) -> float:
    """GB/s a replica of `threads` reads its weights at (the node's rates as `calibrated_rates`
    takes them); 0 when the machine's rate is unknown."""
    all_gbs, core_gbs = calibrated_rates(all_gbs, core_gbs, k)
    if not all_gbs or all_gbs <= 0:
        return 0.0
    if not core_gbs or core_gbs <= 0 or threads <= 0:
        return all_gbs * k.read_share
    return min(k.core_share * core_gbs * threads**k.thread_exp, all_gbs)


def cpu_compute_seconds(type_bytes: Mapping[str, int], threads: int, k: CpuCalibration = DEFAULT_CPU) -> float:
    """Seconds a token's arithmetic takes: each type's bytes at its cost, shared by the threads."""
    costs = k.compute_ns_per_byte
    other = costs.get("", 0.0)
    return sum(n * costs.get(t, other) for t, n in type_bytes.items()) * 1e-9 / max(threads, 1)


def cpu_token_costs(
    threads: int,
    k: CpuCalibration = DEFAULT_CPU,
    type_bytes: Mapping[str, int] | None = None,
    read_bytes: int = 0,
    layers: int = 0,
) -> tuple[float, float]:
    """What a token costs on a CPU beside reading its weights, seconds: its arithmetic (each
    type's bytes at its cost, shared by the threads; without `type_bytes`, `read_bytes` at an
    unmeasured type's) and the threads' waits for each other, once a layer. The same on every
    machine of as many threads: worked out once for them (`cpu_tokens_at`)."""
    compute = cpu_compute_seconds(type_bytes or {"": read_bytes}, threads, k)
    return compute, layers * k.layer_sync_s if threads > 1 else 0.0


def cpu_tokens_at(
    read_bytes: int, rate_gbs: float, costs: tuple[float, float], k: CpuCalibration = DEFAULT_CPU
) -> float:
    """Tokens a second of one reply on a CPU reading at `rate_gbs` (`cpu_read_gbs`), a token
    costing `costs` beside (`cpu_token_costs`); 0 when unknown."""
    if read_bytes <= 0 or rate_gbs <= 0:
        return 0.0
    compute, sync = costs
    return 1 / (read_bytes / (rate_gbs * 1e9) + compute + sync + k.token_fixed_s)


def cpu_tokens_per_second(  # noqa: PLR0913 - the machine's two rates, threads, constants, the model's bytes, types, depth
    read_bytes: int,
    all_gbs: float,
    core_gbs: float | None,
    threads: int,
    k: CpuCalibration = DEFAULT_CPU,
    type_bytes: Mapping[str, int] | None = None,
    layers: int = 0,
) -> float:
    """Tokens a second of one reply on a CPU; 0 when unknown.

    `read_bytes` is what a token reads (a model of experts: its active share); `type_bytes` the
    same by tensor type ("Q4_1": ...), whose arithmetic costs differ; without it every byte
    costs what an unmeasured type does. `layers`: the threads wait for each other once a layer.
    """
    rate = cpu_read_gbs(all_gbs, core_gbs, threads, k)
    return cpu_tokens_at(read_bytes, rate, cpu_token_costs(threads, k, type_bytes, read_bytes, layers), k)


class GpuConstants(msgspec.Struct, frozen=True, kw_only=True):
    """How a card's bandwidth becomes tokens: stated defaults, not measured here (no GPU)."""

    efficiency: float = 0.7
    """Share of the datasheet bandwidth a decode step reaches."""
    tp_exp: float = 0.85
    """Tensor parallel over n cards reads at n^tp_exp of one card's rate (communication costs)."""
    token_fixed_s: float = 0.002
    """Per-token cost that does not grow with the model (launches, sampling)."""


def gpu_tokens_per_second(
    read_bytes: int,
    kv_read_bytes: int,
    bandwidth_gbs: float,
    cards: int = 1,
    tensor_parallel: bool = True,
    g: GpuConstants = GpuConstants(),
) -> float:
    """Tokens a second of one reply on `cards` cards; the KV read at the reply's depth counts.

    Layers split across cards (llama.cpp's default) run one card after another: no faster than
    one card. Tensor parallel splits every layer: faster, sublinearly.
    """
    if bandwidth_gbs <= 0 or read_bytes <= 0:
        return 0.0
    scale = cards**g.tp_exp if tensor_parallel and cards > 1 else 1.0
    return 1 / ((read_bytes + kv_read_bytes) / (bandwidth_gbs * 1e9 * g.efficiency * scale) + g.token_fixed_s)


CPU_PREFILL_GFLOPS = 43.0
"""What one thread of a CPU computes a second while llama.cpp reads a prompt (2 FLOPs a weight a
token; threads add as memory's rate does, threads^0.9). Measured here: SmolLM2-135M Q4_1, a
505-token prompt, 2 threads, 300 tokens a second (llama-server's timings, 2026-12-05)."""
GPU_PREFILL_EFFICIENCY = 0.5
"""Share of a card's dense TFLOPS a prompt's reading reaches."""
JUDGE_PROMPT_TOKENS = 256
"""The prompt a judge's verdict is reckoned for (a chat turn and the judge's instructions)."""
JUDGE_ANSWER_TOKENS = 8
"""A verdict's tokens ("Safety: Unsafe\nCategories: Violent")."""
JUDGE_BOUND_S = 1.0
"""A verdict slower than this holds up every request the judge checks: the plan says so."""


def prefill_tokens_per_second(parameters: int, threads: int = 0, card: Card | None = None, cards: int = 1) -> float:
    """Tokens a second of a prompt read (compute-bound, unlike writing): on `threads` CPU threads,
    or on `cards` of `card`; 0 where unknown."""
    flops = 2.0 * parameters
    if flops <= 0:
        return 0.0
    if card is not None:
        return card.tflops * 1e12 * GPU_PREFILL_EFFICIENCY * cards / flops if card.tflops else 0.0
    return CPU_PREFILL_GFLOPS * 1e9 * max(threads, 1) ** 0.9 / flops


def verdict_seconds(prefill_tps: float, tps: float) -> float:
    """Seconds a judge takes over a verdict: `JUDGE_PROMPT_TOKENS` read, `JUDGE_ANSWER_TOKENS`
    written; 0 where a speed is unknown."""
    if prefill_tps <= 0 or tps <= 0:
        return 0.0
    return JUDGE_PROMPT_TOKENS / prefill_tps + JUDGE_ANSWER_TOKENS / tps


def speed_note(tps: float) -> str:
    """'~N tok/s', marked slow or very slow (with how long a reply of 500 tokens takes)."""
    if tps <= 0:
        return "speed unknown"
    text = f"~{tps:.1f} tok/s" if tps < 10 else f"~{tps:.0f} tok/s"
    if tps < VERY_SLOW_TPS:
        return f"{text} (very slow: a reply of 500 tokens takes about {500 / tps / 60:.0f} minutes)"
    if tps < SLOW_TPS:
        return f"{text} (slow)"
    return text
