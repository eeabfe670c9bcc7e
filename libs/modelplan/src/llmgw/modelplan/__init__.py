"""How much memory and how fast, before a model is served: estimates and the ways to run, without
I/O (as every module under it).

- memory: weights + KV cache for the context + compute buffer + a stated margin, on the CPU or
  per card; vLLM's KV blocks; tensor parallel only where it splits the KV heads.
- speed: one reply's tokens a second, on CPUs from the threads' memory rate (calibrated per node
  where `llmgw plan calibrate` ran), on cards from their bandwidth.
- experts: a model of experts on cards with some layers' experts in host memory (--n-cpu-moe).
- options: every way each file runs on a fleet, ranked best first.
- cards: which cards a profile may run on and which a replica takes (placement and agent alike).
- engine args: the flags and environment a profile may give its engine (catalog and agent alike).
"""

from llmgw.modelplan._cards import FOREIGN_LIMIT_MB, card_fits, card_room, choose_cards, class_bandwidth, usable_cards
from llmgw.modelplan._engine_args import ENGINE_ENV, ENGINE_FLAGS, check_engine_args
from llmgw.modelplan._experts import experts_on_host_mb, fewest_cpu_moe_layers, has_experts, hybrid_tokens_per_second
from llmgw.modelplan._fit import Fitted, Measured, fit_cpu, holdout_error, judge_fit, worst_error
from llmgw.modelplan._memory import (
    KV_CACHE_TYPES,
    Memory,
    Shape,
    active_type_bytes,
    bytes_by_type,
    compute_buffer_bytes,
    experts_host_bytes,
    facts_from_gguf,
    kv_bytes_per_token,
    kv_per_1000_mb,
    kv_read_bytes,
    kv_read_half_way,
    llamacpp_kv_bytes,
    llamacpp_memory,
    shape_from_config,
    shape_from_gguf,
    splits_kv_heads,
    vllm_block_bytes,
    vllm_memory,
)
from llmgw.modelplan._options import CardGroup, FileFacts, NodeFacts, Option, node_facts, options
from llmgw.modelplan._speed import (
    CARDS,
    DEFAULT_CPU,
    JUDGE_BOUND_S,
    SLOW_TPS,
    VERY_SLOW_TPS,
    Card,
    GpuConstants,
    calibrated_rates,
    card_class,
    card_of,
    cpu_compute_seconds,
    cpu_read_gbs,
    cpu_threads,
    cpu_token_costs,
    cpu_tokens_at,
    cpu_tokens_per_second,
    gpu_tokens_per_second,
    prefill_tokens_per_second,
    speed_note,
    verdict_seconds,
)

__all__ = [
    "CARDS",
    "DEFAULT_CPU",
    "ENGINE_ENV",
    "ENGINE_FLAGS",
    "FOREIGN_LIMIT_MB",
    "JUDGE_BOUND_S",
    "KV_CACHE_TYPES",
    "SLOW_TPS",
    "VERY_SLOW_TPS",
    "Card",
    "CardGroup",
    "FileFacts",
    "Fitted",
    "GpuConstants",
    "Measured",
    "Memory",
    "NodeFacts",
    "Option",
    "Shape",
    "active_type_bytes",
    "bytes_by_type",
    "calibrated_rates",
    "card_class",
    "card_fits",
    "card_of",
    "card_room",
    "check_engine_args",
    "choose_cards",
    "class_bandwidth",
    "compute_buffer_bytes",
    "cpu_compute_seconds",
    "cpu_read_gbs",
    "cpu_threads",
    "cpu_token_costs",
    "cpu_tokens_at",
    "cpu_tokens_per_second",
    "experts_host_bytes",
    "experts_on_host_mb",
    "facts_from_gguf",
    "fewest_cpu_moe_layers",
    "fit_cpu",
    "gpu_tokens_per_second",
    "has_experts",
    "holdout_error",
    "hybrid_tokens_per_second",
    "judge_fit",
    "kv_bytes_per_token",
    "kv_per_1000_mb",
    "kv_read_bytes",
    "kv_read_half_way",
    "llamacpp_kv_bytes",
    "llamacpp_memory",
    "node_facts",
    "options",
    "prefill_tokens_per_second",
    "shape_from_config",
    "shape_from_gguf",
    "speed_note",
    "splits_kv_heads",
    "usable_cards",
    "verdict_seconds",
    "vllm_block_bytes",
    "vllm_memory",
    "worst_error",
]
