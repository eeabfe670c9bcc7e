"""A fleet of made-up nodes and an 8B-shaped model, for the serve plan's tests."""

from llmgw.modelplan import CardGroup, FileFacts, NodeFacts, Shape

__all__ = ["BIG", "GIB", "SOURCE", "l40s", "node"]

SOURCE = "org/big@" + "a" * 40 + "/big-dense.Q8_0.gguf"

# An 8B-shaped model of 18 GB, trained for 32768 tokens.
BIG = FileFacts(
    name="big-dense.Q8_0.gguf",
    format="gguf",
    quant="Q8_0",
    shape=Shape(
        layers=32,
        embedding=4096,
        feed_forward=14336,
        heads=32,
        kv_heads=8,
        key_length=128,
        value_length=128,
        vocab=32000,
        parameters=8_000_000_000,
        weight_bytes=18_000_000_000,
        active_bytes=18_000_000_000,
    ),
)
GIB = 1024


def node(name, cpus=64, memory_gb=512, all_gbs=300.0, one_gbs=10.0, cards=(), calibration=None):
    return NodeFacts(
        name=name,
        cpus=cpus,
        memory_total_mb=memory_gb * GIB,
        memory_available_mb=memory_gb * GIB,
        membw_all_gbs=all_gbs,
        membw_one_gbs=one_gbs,
        cards=list(cards),
        calibration=calibration,
    )


def l40s(count=2, free=2):
    return CardGroup(cls="l40s-48g", memory_mb=48 * GIB, count=count, free=free)
