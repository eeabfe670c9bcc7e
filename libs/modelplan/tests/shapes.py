"""A model of experts larger than a card, for the plan's tests (modelplan's and the serve plan's)."""

from llmgw.modelplan import FileFacts, Shape

__all__ = ["FILE", "GB", "MOE"]

GB = 10**9

# Shaped like a 117B model of experts in 4-bit (gpt-oss-120b's figures, rounded): 36 layers of 128
# experts, 4 used a token; 61 of its 63 GB are the routed experts.
MOE = Shape(
    layers=36,
    embedding=2880,
    feed_forward=2880,
    heads=64,
    kv_heads=8,
    key_length=64,
    value_length=64,
    vocab=201088,
    parameters=117_000_000_000,
    weight_bytes=63 * GB,
    active_bytes=2 * GB + 61 * GB * 4 // 128,
    type_bytes={"MXFP4": 61 * GB, "BF16": 2 * GB},
    experts=128,
    experts_used=4,
    expert_bytes=61 * GB,
)
FILE = FileFacts(name="moe.gguf", format="gguf", quant="MXFP4", shape=MOE)
