"""A model of experts larger than its card: the fewest layers whose experts go to host memory,
what each side then holds, and the speed the plan gives it against the formula worked by hand."""

import msgspec
import pytest

from libs.modelplan.tests.shapes import FILE, GB, MOE
from llmgw.modelplan import (
    DEFAULT_CPU,
    CardGroup,
    GpuConstants,
    NodeFacts,
    experts_host_bytes,
    experts_on_host_mb,
    fewest_cpu_moe_layers,
    gpu_tokens_per_second,
    hybrid_tokens_per_second,
    kv_bytes_per_token,
    llamacpp_memory,
    options,
)
from llmgw.modelplan._experts import HOP_S


def _node(card_gb=24, host_gb=128, free=1):
    cards = [CardGroup(cls="rtx4090-24g", memory_mb=card_gb * 1024, count=1, free=free)] if card_gb else []
    return NodeFacts(
        name="box",
        cpus=16,
        memory_total_mb=host_gb * 1024,
        memory_available_mb=host_gb * 1024,
        membw_all_gbs=60.0,
        membw_one_gbs=12.0,
        cards=cards,
    )


def test_the_fewest_layers_move_that_let_the_rest_fit_the_card():
    room = 24 * 1024 * 0.95
    n = fewest_cpu_moe_layers(MOE, 8192, 1, 1, room)
    assert 0 < n < MOE.layers
    assert llamacpp_memory(MOE, 8192, 1, cards=1, cpu_moe=n).mib <= room
    assert llamacpp_memory(MOE, 8192, 1, cards=1, cpu_moe=n - 1).mib > room
    assert fewest_cpu_moe_layers(MOE, 8192, 1, 1, 96 * 1024) == 0  # fits whole: nothing moves
    assert fewest_cpu_moe_layers(MOE, 8192, 1, 1, 2 * 1024) == -1  # not even the dense part
    assert fewest_cpu_moe_layers(MOE, 8192, 1, 2, room) == -1  # over two cards the last keeps its experts
    dense = msgspec.structs.replace(MOE, expert_bytes=0, experts=0, experts_used=0)
    assert fewest_cpu_moe_layers(dense, 8192, 1, 1, room) == -1  # no experts to move


def test_host_memory_holds_the_moved_layers_experts_only():
    assert experts_host_bytes(MOE, 0) == 0
    assert experts_host_bytes(MOE, 9) == 61 * GB * 9 // 36
    assert experts_host_bytes(MOE, 99) == 61 * GB  # past the last layer: all of them
    assert experts_on_host_mb(MOE, 9) == -(-(61 * GB * 9 // 36 * 105 // 100 + 256 * 2**20) // 2**20)
    card = llamacpp_memory(MOE, 8192, 1, cards=1, cpu_moe=9)
    assert card.weights == 63 * GB - 61 * GB * 9 // 36
    assert llamacpp_memory(MOE, 8192, 1, cards=0, cpu_moe=9).weights == 63 * GB  # the CPU holds all anyway


def test_leading_dense_layers_hold_no_experts_to_move():
    deep = msgspec.structs.replace(MOE, first_expert_layer=3)  # DeepSeek-style: three dense layers first
    assert experts_host_bytes(deep, 3) == 0
    assert experts_host_bytes(deep, 4) == 61 * GB // 33


def test_the_speed_is_the_cards_side_plus_the_hosts_side_worked_by_hand():
    kv, n, host = 1_000_000, 18, (60.0, 12.0, 8)
    got = hybrid_tokens_per_second(MOE, n, kv, 1008.0, host)
    moved_active = int(61 * GB * 18 / 36 * 4 / 128)  # half the layers' experts, 4 of 128 read a token
    g = GpuConstants()
    card_s = (MOE.active_bytes - moved_active + kv) / (1008e9 * g.efficiency) + g.token_fixed_s
    rate = min(DEFAULT_CPU.core_share * 12.0 * 8**DEFAULT_CPU.thread_exp, 60.0)  # GB/s 8 threads read
    costs = DEFAULT_CPU.compute_ns_per_byte
    compute = (moved_active * 61 / 63 * costs[""] + moved_active * 2 / 63 * costs[""]) * 1e-9 / 8  # unmeasured types
    host_s = moved_active / (rate * 1e9) + compute + 18 * (DEFAULT_CPU.layer_sync_s + HOP_S)
    assert got == pytest.approx(1 / (card_s + host_s), rel=1e-3)
    assert hybrid_tokens_per_second(MOE, 0, kv, 1008.0, host) == pytest.approx(
        gpu_tokens_per_second(MOE.active_bytes, kv, 1008.0, 1, tensor_parallel=False)
    )
    speeds = [hybrid_tokens_per_second(MOE, k, kv, 1008.0, host) for k in (6, 12, 24, 36)]
    assert speeds == sorted(speeds, reverse=True)  # each layer moved costs
    assert hybrid_tokens_per_second(MOE, n, kv, 1008.0, (0.0, None, 8)) == 0.0  # the host's rate unknown


def test_the_plan_offers_the_card_with_experts_on_the_cpu_where_the_card_alone_cannot():
    ways = options([FILE], [_node()], 8192)
    card = next(o for o in ways if o.device != "cpu")
    cpu = next(o for o in ways if o.device == "cpu")
    n = fewest_cpu_moe_layers(MOE, 8192, 1, 1, 24 * 1024 * 0.95)
    assert card.cpu_moe_layers == n and card.host_mb == experts_on_host_mb(MOE, n)
    assert card.need_mb == llamacpp_memory(MOE, 8192, 1, cards=1, cpu_moe=n).mib <= 24 * 1024
    assert card.threads == 8 and card.free_now
    kv = int(kv_bytes_per_token(MOE) * 8192 / 2)
    assert card.tokens_per_second == round(hybrid_tokens_per_second(MOE, n, kv, 1008.0, (60.0, 12.0, 8)), 2)
    assert card.tokens_per_second > cpu.tokens_per_second  # the dense part at the card's rate pays
    assert ways[0] == card


def test_the_host_must_hold_the_experts_for_the_way_to_be_offered_and_have_them_free_for_it_to_fit_now():
    assert options([FILE], [_node(host_gb=16)], 8192) == []  # neither the experts nor the whole fit 16 GB
    busy = msgspec.structs.replace(_node(), memory_available_mb=8 * 1024)
    card = next(o for o in options([FILE], [busy], 8192) if o.device != "cpu")
    assert card.cpu_moe_layers and not card.free_now
