"""A replica's need from the model's shape: weights, the KV cache for its context and slots at
its profile's cache type, compute buffers (`llmgw.modelplan`'s estimate, as `llmgw plan`'s)."""

import itertools

import msgspec
import pytest

from libs.modelplan.tests.shapes import MOE
from llmgw.modelplan import (
    DEFAULT_CPU,
    Shape,
    card_of,
    cpu_threads,
    experts_on_host_mb,
    fewest_cpu_moe_layers,
    hybrid_tokens_per_second,
    kv_read_bytes,
    llamacpp_memory,
)
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, Scaling
from llmgw.scheduler.core import Actual, Desired, NodeView, reconcile
from llmgw.scheduler.placement import kv_cache_type, need_of, speed_of
from services.scheduler.tests.fake_nodes import Node, states

NOW = 1_000_000.0
SOURCE = "o/r/m.gguf"
EIGHT_B = Shape(
    layers=32,
    embedding=4096,
    feed_forward=14336,
    heads=32,
    kv_heads=8,
    key_length=128,
    value_length=128,
    vocab=128256,
    parameters=8_000_000_000,
    weight_bytes=4_920_000_000,
    active_bytes=4_920_000_000,
)
"""An 8B model at Q4_K_M: 128 KiB of f16 KV a token, so 16 GiB for 131072 tokens."""


def node(name, memory_mb, cards=0, card_mb=81559):
    gpus = [
        GpuInfo(index=i, uuid=f"{name}-{i}", name="h100", cls="h100-80g", memory_total_mb=card_mb) for i in range(cards)
    ]
    info = NodeInfo(
        node=name,
        hostname=name,
        cpus=16,
        memory_total_mb=memory_mb,
        memory_available_mb=memory_mb,
        engines={"llamacpp": "1"},
        gpus=gpus,
    )
    return NodeView(info=info, last_seen=NOW)


def run(model, nodes, shapes):
    return reconcile(
        Desired(models={model.name: model}),
        Actual(nodes={n.info.node: n for n in nodes}, weights={SOURCE: EIGHT_B.weight_bytes}, shapes=shapes),
        NOW,
        ids=(f"r{i}" for i in itertools.count()),
    )


@pytest.mark.parametrize(
    ("args", "cache"),
    [
        ([], "f16"),
        (["-ctk", "q8_0", "-ctv", "q8_0"], "q8_0"),
        (["--cache-type-k=q4_0", "--cache-type-v=q8_0"], "q8_0"),
        (["-ctk", "iq4_nl"], "f16"),
    ],
)
def test_the_kv_cache_type_is_the_wider_the_profile_gives_f16_by_default(args, cache):
    assert kv_cache_type(Profile(args=args)) == cache


@pytest.mark.parametrize(
    ("profile", "context", "memory", "card"),
    [
        (Profile(slots=2), 8192, llamacpp_memory(EIGHT_B, 8192, 2).mib, 0),
        (Profile(slots=4), 131072, llamacpp_memory(EIGHT_B, 131072, 4).mib, 0),
        (
            Profile(args=["-ctk", "q8_0", "-ctv", "q8_0"]),
            131072,
            llamacpp_memory(EIGHT_B, 131072, 2, cache="q8_0").mib,
            0,
        ),
        (Profile(host_memory_mb=9000), 131072, 9000, 0),
        (Profile(gpus=1), 131072, 0, llamacpp_memory(EIGHT_B, 131072, 2, cards=1).mib),
        (Profile(gpus=2), 131072, 0, llamacpp_memory(EIGHT_B, 131072, 2, cards=2).mib),
        (Profile(nodes=2), 32768, llamacpp_memory(EIGHT_B, 32768, 2, cards=2).mib, 0),
    ],
)
def test_a_replicas_need_is_modelplans_estimate_for_its_context_and_slots(profile, context, memory, card):
    need = need_of(profile, EIGHT_B.weight_bytes, EIGHT_B, context)
    assert (need.memory_mb, need.card_mb) == (memory, card)
    assert need.estimate_mb == (memory if not profile.gpus else card * profile.gpus)


def test_without_a_shape_the_need_is_the_files_size_and_a_margin():
    need = need_of(Profile(), 4 * 2**30)
    assert need.memory_mb == int(4 * 2**30 * 1.1 / 2**20) + 256 == need.estimate_mb


def test_a_file_that_fits_a_node_but_whose_context_does_not_is_parked_with_the_numbers():
    model = Model(name="m", source=SOURCE, context=131072, scaling=Scaling(min=1, max=1))
    plan = run(model, [node("a", 16 * 1024), node("b", 12 * 1024)], {SOURCE: EIGHT_B})
    need = llamacpp_memory(EIGHT_B, 131072, 2)
    assert plan.starts == []
    why = plan.unplaced["m"]
    assert f"a: memory: needs {need.mib} MiB" in why and f"{16 * 1024 - 512} MiB free" in why
    assert f"b: memory: needs {need.mib} MiB" in why and f"{12 * 1024 - 512} MiB free" in why
    assert "KV 16384 MiB for a context of 131072" in why
    assert "a context of " in why.split("MiB free", 1)[1]  # what would fit here, said


def test_the_same_file_with_a_short_context_starts_and_its_record_carries_the_estimate():
    model = Model(name="m", source=SOURCE, context=8192, scaling=Scaling(min=1, max=1))
    plan = run(model, [node("a", 16 * 1024)], {SOURCE: EIGHT_B})
    assert [(s.replica.node, s.replica.estimate_mb) for s in plan.starts] == [
        ("a", llamacpp_memory(EIGHT_B, 8192, 2).mib)
    ]


def test_a_context_no_card_can_hold_parks_a_card_profile_with_the_card_memory_it_needs():
    model = Model(name="m", source=SOURCE, context=1_048_576, profiles=[Profile(name="gpu", gpus=1)])
    plan = run(model, [node("a", 512 * 1024, cards=2)], {SOURCE: EIGHT_B})
    per_card = llamacpp_memory(EIGHT_B, 1_048_576, 2, cards=1).mib
    assert plan.starts == []
    assert f"a: cards: needs 1 free any class cards of {per_card} MiB; has 0 (of 2)" in plan.unplaced["m"]


def test_a_card_profile_whose_context_fits_the_card_is_placed_on_it():
    model = Model(name="m", source=SOURCE, context=131072, profiles=[Profile(name="gpu", gpus=1)])
    plan = run(model, [node("a", 64 * 1024, cards=2)], {SOURCE: EIGHT_B})
    assert [(s.replica.node, s.replica.gpus) for s in plan.starts] == [("a", ["a-0"])]


def test_a_card_profile_with_experts_on_the_cpu_takes_the_card_for_the_rest_and_host_memory_for_them():
    n = fewest_cpu_moe_layers(MOE, 8192, 2, 1, 24 * 1024 * 0.95)
    need = need_of(Profile(gpus=1, cpu_moe_layers=n), MOE.weight_bytes, MOE, 8192)
    assert need.card_mb == llamacpp_memory(MOE, 8192, 2, cards=1, cpu_moe=n).mib <= 24 * 1024
    assert need.memory_mb == experts_on_host_mb(MOE, n) > 0
    assert f"and {need.memory_mb} MiB of experts in host memory" in need.sizing
    given = need_of(Profile(gpus=1, cpu_moe_layers=n, host_memory_mb=70_000), MOE.weight_bytes, MOE, 8192)
    assert given.memory_mb == 70_000  # the operator's figure wins


def test_experts_on_the_cpu_are_placed_by_both_memories_the_cards_and_the_hosts():
    n = fewest_cpu_moe_layers(MOE, 8192, 2, 1, 24 * 1024 * 0.95)
    model = Model(name="m", source=SOURCE, context=8192, profiles=[Profile(name="gpu", gpus=1, cpu_moe_layers=n)])
    small_host = node("a", 16 * 1024, cards=1, card_mb=24 * 1024)
    plan = run(model, [small_host, node("b", 128 * 1024, cards=1, card_mb=24 * 1024)], {SOURCE: MOE})
    assert [(s.replica.node, s.replica.gpus, s.replica.memory_mb) for s in plan.starts] == [
        ("b", ["b-0"], experts_on_host_mb(MOE, n))
    ]
    parked = run(model, [small_host], {SOURCE: MOE})
    assert parked.starts == [] and f"a: memory: needs {experts_on_host_mb(MOE, n)} MiB" in parked.unplaced["m"]
    whole = Model(name="m", source=SOURCE, context=8192, profiles=[Profile(name="gpu", gpus=1)])
    assert run(whole, [node("b", 128 * 1024, cards=1, card_mb=24 * 1024)], {SOURCE: MOE}).starts == []


def test_experts_on_the_cpu_are_as_fast_as_the_plan_says_reading_only_a_sliding_windows_kv():
    # A model of experts whose every other layer attends to a 128-token window (gpt-oss): the
    # scheduler reckons a replica with experts in host memory as the plan does, the KV read at
    # depth only the window's on those layers.
    windowed = msgspec.structs.replace(MOE, sliding_window=128, swa_layers=MOE.layers // 2)
    n = fewest_cpu_moe_layers(windowed, 8192, 2, 1, 23034 * 0.95)
    need = need_of(Profile(gpus=1, cpu_moe_layers=n), windowed.weight_bytes, windowed, 8192)
    view = states(Node("a").cpus(16).memory(128).membw(100, 10).cards(1, "l4-24g", 23034))["a"]
    host = (100, 10, cpu_threads(need.profile.cpu_cores, 16))
    kv = kv_read_bytes(windowed, 8192 // max(need.profile.slots, 1) // 2)
    want = hybrid_tokens_per_second(windowed, n, kv, card_of("l4-24g").bandwidth_gbs, host, DEFAULT_CPU)
    assert n > 0 and speed_of(need, view) == pytest.approx(want)
