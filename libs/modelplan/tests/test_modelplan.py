"""The estimates as table tests: speeds against what another fleet measured, memory by the
formulas, the ways to run ranked."""

import msgspec
import pytest

from llmgw.gguf import Header
from llmgw.modelplan import (
    DEFAULT_CPU,
    CardGroup,
    FileFacts,
    NodeFacts,
    Shape,
    card_class,
    card_of,
    cpu_threads,
    cpu_tokens_per_second,
    gpu_tokens_per_second,
    kv_bytes_per_token,
    kv_read_bytes,
    llamacpp_memory,
    options,
    shape_from_config,
    shape_from_gguf,
    speed_note,
    splits_kv_heads,
    vllm_block_bytes,
    vllm_memory,
)
from llmgw.proto import CpuCalibration

GB = 10**9

# Measured by llama-bench on another fleet (the constants' source): bytes a token reads, the
# node's all-cores and one-core GB/s, threads, and the tokens a second it got.
MEASURED = [
    (4683073536, 43.9, 9.7, 1, 1.88),  # qwen2.5-coder-7b Q4_K_M, an 8-vCPU node
    (4683073536, 43.9, 9.7, 2, 3.56),
    (4683073536, 43.9, 9.7, 4, 6.35),
    (4683073536, 43.9, 9.7, 8, 9.29),
    (1117320736, 43.9, 9.7, 1, 8.31),  # qwen2.5-1.5b Q4_K_M
    (1117320736, 43.9, 9.7, 4, 25.4),
    (1117320736, 34.2, 10.1, 2, 14.5),  # a 4-vCPU node on two threads
    (9_000_000_000, 43.9, 9.7, 4, 3.3),  # qwen2.5-14b on four
]


@pytest.mark.parametrize(("read", "all_gbs", "core_gbs", "threads", "measured"), MEASURED)
def test_the_cpu_speed_is_within_15_percent_of_what_was_measured(read, all_gbs, core_gbs, threads, measured):
    assert cpu_tokens_per_second(read, all_gbs, core_gbs, threads) == pytest.approx(measured, rel=0.15)


def test_a_few_threads_of_a_big_machine_read_at_the_threads_rate_not_the_machines():
    assert cpu_tokens_per_second(18 * GB, 300, 10, 4) < 2.5
    assert cpu_tokens_per_second(18 * GB, 300, 10, 64) > 5 * cpu_tokens_per_second(18 * GB, 300, 10, 4)


def test_without_one_cores_rate_the_machines_rate_is_taken_at_its_share():
    k = DEFAULT_CPU
    compute = k.compute_ns_per_byte[""] / 4
    assert cpu_tokens_per_second(GB, 40, None, 4) == pytest.approx(1 / (1 / (40 * 0.68) + compute + k.token_fixed_s))
    assert cpu_tokens_per_second(GB, 0, None, 4) == 0 and cpu_tokens_per_second(0, 40, 10, 4) == 0


def test_a_nodes_calibration_replaces_the_defaults():
    slower = CpuCalibration(core_share=0.5, thread_exp=1.0, token_fixed_s=0.0)
    assert cpu_tokens_per_second(GB, 100, 10, 2, slower) == pytest.approx(10.0)


def test_threads_are_the_profiles_cores_else_half_the_nodes():
    assert (cpu_threads(None, 64), cpu_threads(6, 64), cpu_threads(None, 1)) == (32, 6, 1)


def test_a_card_reads_at_its_bandwidth_and_tensor_parallel_adds_sublinearly():
    one = gpu_tokens_per_second(8 * GB, 0, 3350)
    assert one == pytest.approx(1 / (8 / (3350 * 0.7) + 0.002))
    four = gpu_tokens_per_second(8 * GB, 0, 3350, 4)
    assert 1.5 * one < four < 4 * one  # the fixed cost per token does not shrink
    assert gpu_tokens_per_second(8 * GB, 0, 3350, 4, tensor_parallel=False) == one  # layers split: one after another
    assert gpu_tokens_per_second(8 * GB, 4 * GB, 3350) < one  # the KV at depth is read too


@pytest.mark.parametrize(
    ("name", "mib", "cls", "bandwidth"),
    [
        ("NVIDIA H200", 143771, "h200-141g", 4800),
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g", 3350),
        ("NVIDIA H100 PCIe", 81559, "h100-pcie-80g", 2000),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-40g", 1555),
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80g", 2039),
        ("NVIDIA L40S", 46068, "l40s-48g", 864),
        ("NVIDIA L4", 23034, "l4-24g", 300),
        ("Tesla T4", 15360, "t4-16g", 320),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g", 1008),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192, "a100-mig-3g.40gb", 2039 * 3 / 7),
    ],
)
def test_a_card_gets_one_class_name_and_its_datasheet_bandwidth(name, mib, cls, bandwidth):
    assert card_class(name, mib) == cls
    assert card_of(cls).bandwidth_gbs == bandwidth


@pytest.mark.parametrize(
    ("tps", "note"),
    [
        (40, "~40 tok/s"),
        (12, "~12 tok/s (slow)"),
        (2.5, "~2.5 tok/s (very slow: a reply of 500 tokens takes about 3 minutes)"),
        (0, "speed unknown"),
    ],
)
def test_slow_and_very_slow_are_said(tps, note):
    assert speed_note(tps) == note


LLAMA3_8B = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_kv_per_token_for_llama_cpps_cache_types():
    shape = shape_from_config(LLAMA3_8B, 16 * GB)
    assert kv_bytes_per_token(shape) == 128 * 1024  # 32 layers x 8 heads x (128 + 128) x 2 bytes
    assert kv_bytes_per_token(shape, "q8_0") == 128 * 1024 * 34 / 64
    assert kv_bytes_per_token(shape, "q4_0") == 128 * 1024 * 18 / 64
    with pytest.raises(ValueError, match="'q3' is not one of"):
        kv_bytes_per_token(shape, "q3")


def test_a_vllm_block_holds_16_tokens_and_tensor_parallel_splits_it():
    shape = shape_from_config(LLAMA3_8B, 16 * GB)
    assert vllm_block_bytes(shape) == 16 * 128 * 1024
    one, two = vllm_memory(shape, 8192), vllm_memory(shape, 8192, tensor_parallel=2)
    assert one.kv == 8192 * 128 * 1024 and two.kv == one.kv // 2 and two.weights == one.weights // 2


def test_tensor_parallel_only_where_it_splits_the_kv_heads():
    shape = shape_from_config(LLAMA3_8B, 16 * GB)
    assert [n for n in range(1, 9) if splits_kv_heads(shape, n)] == [1, 2, 4, 8]


def test_a_config_that_is_not_a_decoders_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="lacks 'num_attention_heads'"):
        shape_from_config({"hidden_size": 8}, GB)


def test_llamacpp_memory_is_weights_kv_compute_and_a_stated_margin():
    shape = Shape(
        layers=4,
        embedding=256,
        heads=8,
        kv_heads=2,
        key_length=32,
        value_length=32,
        vocab=259,
        weight_bytes=2_517_600,
        active_bytes=2_517_600,
    )
    m = llamacpp_memory(shape, 4096)
    assert m.kv == 4 * 2**20 and m.weights == 2_517_600
    assert m.total == m.weights + m.kv + m.compute + m.margin
    per_card = llamacpp_memory(shape, 4096, cards=2)
    assert per_card.weights == m.weights // 2 and per_card.kv == m.kv // 2


def _q4(name="m-Q4_K_M.gguf", params=32 * GB, weights=18 * GB):
    shape = Shape(
        layers=64,
        embedding=5120,
        heads=40,
        kv_heads=8,
        key_length=128,
        value_length=128,
        vocab=152064,
        parameters=params,
        weight_bytes=weights,
        active_bytes=weights,
    )
    return FileFacts(name=name, format="gguf", quant="Q4_K_M", shape=shape)


def _big(name="big", free=2):
    return NodeFacts(
        name=name,
        cpus=64,
        memory_total_mb=512 * 1024,
        memory_available_mb=400 * 1024,
        membw_all_gbs=300,
        membw_one_gbs=10,
        cards=[CardGroup(cls="l40s-48g", memory_mb=46068, count=2, free=free)],
    )


def test_a_plans_ways_say_how_fast_they_answer_and_cards_beat_the_cpu():
    ways = options([_q4()], [_big()], 4096)
    cpu = next(w for w in ways if w.device == "cpu")
    card = next(w for w in ways if w.device == "l40s-48g" and w.cards == 1)
    assert cpu.tokens_per_second == pytest.approx(cpu_tokens_per_second(18 * GB, 300, 10, 32, layers=64), abs=0.01)
    assert card.tokens_per_second > 2 * cpu.tokens_per_second
    assert ways[0] == card and cpu.threads == 32 and card.engine == "llamacpp"
    assert cpu.kv_per_1000_mb == pytest.approx(64 * 8 * 256 * 2 * 1000 / 2**20, abs=0.01)


def test_ways_free_now_rank_before_faster_ways_that_wait_for_room():
    busy = _big(free=0)
    ways = options([_q4()], [busy], 4096)
    assert ways[0].device == "cpu" and ways[0].free_now
    assert all(not w.free_now for w in ways if w.device != "cpu")


def test_a_way_is_reported_on_the_node_where_it_is_fastest_with_how_many_nodes_fit():
    slow = NodeFacts(
        name="slow", cpus=8, memory_total_mb=64 * 1024, memory_available_mb=60 * 1024, membw_all_gbs=40, membw_one_gbs=8
    )
    ways = options([_q4()], [slow, _big()], 4096)
    cpu = next(w for w in ways if w.device == "cpu")
    assert cpu.node == "big" and cpu.nodes_fit == 2 and cpu.nodes_free == 2


def test_a_model_too_big_for_a_card_gets_two_and_vllm_only_for_safetensors():
    big = _q4(weights=60 * GB)
    ways = options([big], [_big()], 4096)
    assert {(w.device, w.cards) for w in ways} == {("cpu", 0), ("l40s-48g", 2)}
    safetensors = FileFacts(name="m", format="safetensors", shape=shape_from_config(LLAMA3_8B, 16 * GB))
    node = NodeFacts(
        name="g",
        cpus=32,
        memory_total_mb=256 * 1024,
        memory_available_mb=200 * 1024,
        engines=["vllm", "llamacpp"],
        cards=[CardGroup(cls="h100-80g", memory_mb=81559, count=8, free=8)],
    )
    vllm = options([safetensors], [node], 8192)
    assert {(w.engine, w.cards, w.tensor_parallel) for w in vllm} == {("vllm", n, True) for n in (1, 2, 4, 8)}
    assert vllm[0].cards == 8  # fastest


def test_a_nodes_report_becomes_plan_facts_with_its_cards_grouped_by_class():
    from llmgw.modelplan import node_facts
    from llmgw.proto import GpuInfo, NodeInfo

    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA L40S",
            cls="l40s-48g",
            memory_total_mb=46068,
            memory_used_mb=20000 if i == 0 else 100,
        )
        for i in range(4)
    ]
    info = NodeInfo(
        node="n",
        hostname="n",
        cpus=32,
        memory_total_mb=256000,
        memory_available_mb=200000,
        engines={"llamacpp": "100", "vllm": "0.11"},
        membw_all_gbs=200,
        membw_one_gbs=12,
        gpus=gpus,
    )
    facts = node_facts(info)
    assert facts.cards == [CardGroup(cls="l40s-48g", memory_mb=46068, count=4, free=3)]
    assert facts.engines == ["llamacpp", "vllm"] and facts.membw_one_gbs == 12


GEMMA3_270M = Shape(layers=18, embedding=640, heads=4, kv_heads=1, key_length=256, value_length=256, vocab=262144)


def test_sliding_window_layers_keep_only_their_window_as_llama_cpp_sizes_it():
    """Gemma 3 attends to a 512-token window on five layers of every six: llama.cpp keeps the full
    context for the other three of its 18 and the window plus a micro-batch (padded to 256) for
    the 15 (its log: 6.00 MiB of 2048 cells, 15.00 MiB of 1024 cells)."""
    header = Header(where="g.gguf", version=3, architecture="gemma3", block_count=18, sliding_window=512)
    assert shape_from_gguf(header).swa_layers == 15
    gemma = msgspec.structs.replace(GEMMA3_270M, sliding_window=512, swa_layers=15)
    assert llamacpp_memory(gemma, 2048).kv == 21 * 2**20
    assert llamacpp_memory(GEMMA3_270M, 2048).kv == 36 * 2**20  # the window unknown: every layer whole
    four = llamacpp_memory(gemma, 8192, slots=4).kv  # each slot's stream holds its window
    assert four == (3 * 8192 + 15 * 4 * 1024) * 1024
    ways = options([FileFacts(name="g", format="gguf", shape=gemma)], [_big()], 2048)
    way = next(w for w in ways if w.device == "cpu")
    assert way.kv_per_1000_mb == pytest.approx(21 * 1000 / 2048, abs=0.01)  # at that context
    tiny = llamacpp_memory(gemma, 256).kv  # a context shorter than the window: the window is the context
    assert tiny == 18 * 256 * 1024
    mistral = Header(where="m.gguf", version=3, architecture="llama", block_count=32, sliding_window=4096)
    assert shape_from_gguf(mistral).swa_layers == 0  # llama.cpp runs a llama with a window on every layer whole


def test_a_sliding_window_layer_reads_only_its_window_of_the_kv_at_depth():
    """A generated token reads each layer's keys and values of the tokens before it, but Gemma 3's
    windowed layers (15 of its 18) only of the last 512: on a card, where that read counts, the
    plan answers faster with the window known than with every layer whole."""
    gemma = msgspec.structs.replace(GEMMA3_270M, sliding_window=512, swa_layers=15)
    per_layer = kv_bytes_per_token(GEMMA3_270M) / 18
    assert kv_read_bytes(gemma, 4096) == int(per_layer * (3 * 4096 + 15 * 512))
    assert kv_read_bytes(gemma, 300) == kv_read_bytes(GEMMA3_270M, 300) == int(kv_bytes_per_token(gemma) * 300)
    on_card = {}
    for name, shape in (("window", gemma), ("whole", GEMMA3_270M)):
        shape = msgspec.structs.replace(shape, active_bytes=247 * 2**20)  # its file's tensors
        ways = options([FileFacts(name="g", format="gguf", shape=shape)], [_big()], 32768)
        on_card[name] = next(w for w in ways if w.device == "l40s-48g" and w.cards == 1).tokens_per_second
    assert on_card["window"] > on_card["whole"]
