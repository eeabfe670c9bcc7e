"""The serve plan as table tests with the messages asserted, and the model a chosen way becomes
(the rule that makes the CPU a choice made on purpose: test_serve_rule.py)."""

import msgspec
import pytest

from libs.modelplan.tests.shapes import FILE as MOE_FILE
from libs.modelplan.tests.shapes import MOE
from llmgw.bus import BadRequest
from llmgw.catalog.serve import (
    check_serve,
    choose_ways,
    reply_words,
    serve_plan,
)
from llmgw.catalog.served import default_name, parse_replicas, served_model
from llmgw.modelplan import CardGroup, experts_host_bytes, experts_on_host_mb
from llmgw.proto import CpuCalibration
from llmgw.proto.catalog import ServeModel, ServePlanAsk
from services.catalog.tests.serve_fleet import BIG, GIB, SOURCE, l40s, node


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(40, "about 40 seconds"), (89.4, "about 89 seconds"), (180, "about 3 minutes"), (0.2, "about 1 seconds")],
)
def test_a_replys_time_is_said_in_seconds_then_minutes(seconds, words):
    assert reply_words(seconds) == words


def test_the_plan_lists_every_way_best_first_with_its_memory_nodes_room_and_speed():
    calibration = CpuCalibration(source="llmgw plan calibrate on small")
    fleet = [
        node("gpu-1", cpus=32, memory_gb=256, cards=[l40s(count=2, free=2)]),
        node("small", cpus=8, memory_gb=64, all_gbs=8.0, one_gbs=2.0, calibration=calibration),
    ]
    plan = serve_plan(ServePlanAsk(source=SOURCE, cores=4), BIG, 32768, fleet)
    assert plan.context == 8192 and plan.trained_context == 32768 and plan.warnings == []
    kinds = [(w.kind, w.cards, w.card_class) for w in plan.ways]
    assert kinds == [("gpu", 1, "l40s-48g"), ("multi-gpu", 2, "l40s-48g"), ("cpu", 0, "")]
    one, two, cpu = plan.ways
    assert one.nodes_fit == ["gpu-1"] and one.more_replicas == 2 and two.more_replicas == 1
    assert one.tokens_per_s > 15 and one.mark == "" and not one.calibrated
    assert cpu.threads == 4 and cpu.nodes_fit == ["gpu-1", "small"] and cpu.node == "gpu-1"
    assert cpu.more_replicas == 256 * GIB // cpu.memory_mb + 64 * GIB // cpu.memory_mb
    assert cpu.mark == "very slow" and cpu.reply_500_s == round(500 / cpu.tokens_per_s, 1)
    assert cpu.on_purpose and not one.on_purpose and not two.on_purpose  # the form's "CPU anyway" box
    for w in plan.ways:
        assert w.weights_mb + w.kv_mb + w.buffers_mb - 2 <= w.memory_mb <= w.weights_mb + w.kv_mb + w.buffers_mb
    assert cpu.kv_mb == 8192 * 32 * 8 * 256 * 2 // 2**20  # f16 keys and values, every layer
    assert one.kv_mb == cpu.kv_mb and two.kv_mb == cpu.kv_mb // 2  # layers split over two cards


def test_the_cpu_speed_follows_the_cores_and_says_when_the_node_was_calibrated():
    calibrated = node("big", calibration=CpuCalibration(source="measured"))
    few = serve_plan(ServePlanAsk(source=SOURCE, cores=4), BIG, 0, [calibrated]).ways[0]
    half = serve_plan(ServePlanAsk(source=SOURCE), BIG, 0, [calibrated]).ways[0]
    assert few.threads == 4 and half.threads == 32 and half.tokens_per_s > 4 * few.tokens_per_s
    assert few.calibrated and few.mark == "very slow"


def test_a_way_that_fits_no_node_now_is_listed_with_no_nodes_and_after_those_that_fit():
    busy = node("gpu-1", cards=[l40s(count=1, free=0)])
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 4096, [busy])
    cpu, card = plan.ways
    assert (cpu.kind, cpu.nodes_fit, cpu.more_replicas) == ("cpu", ["gpu-1"], 512 * GIB // cpu.memory_mb)
    assert (card.kind, card.nodes_fit, card.more_replicas, card.node) == ("gpu", [], 0, "gpu-1")


@pytest.mark.parametrize(
    ("ask", "trained", "fleet", "message"),
    [
        pytest.param(
            ServePlanAsk(source=SOURCE, cores=16),
            0,
            [node("a", cpus=8), node("b", cpus=12)],
            "cores 16 is above every node's: the most any node has is 12; write --cores 12 or fewer (0: half a node's)",
            id="cores above every node's",
        ),
        pytest.param(
            ServePlanAsk(source=SOURCE, context=1_000_000),
            32768,
            [node("small", memory_gb=64)],
            "context 1000000 is above the 32768 tokens the model was trained for, and no node has the memory for "
            "it; write --context 32768 or less",
            id="a context past the training that no memory holds",
        ),
        pytest.param(
            ServePlanAsk(source=SOURCE, context=100),
            0,
            [node("a")],
            "context 100 is below the 128 tokens a model in the catalog takes at least; write --context 128 or "
            "more (0: the model's trained context, at most 8192)",
            id="a context under the catalog's least",
        ),
        pytest.param(
            ServePlanAsk(source=SOURCE),
            0,
            [],
            "no node has registered with the scheduler: start an agent (`llmgw service agent`), then ask again",
            id="no node",
        ),
    ],
)
def test_a_plan_that_cannot_be_made_is_refused_saying_what_to_write(ask, trained, fleet, message):
    with pytest.raises(BadRequest) as caught:
        serve_plan(ask, BIG, trained, fleet)
    assert caught.value.message == message


def test_a_context_past_the_training_that_fits_is_warned_and_one_that_fits_nowhere_says_the_longest_that_does():
    past = serve_plan(ServePlanAsk(source=SOURCE, context=65536), BIG, 32768, [node("big")])
    assert past.context == 65536 and past.ways
    assert past.warnings == [
        "context 65536 is above the 32768 tokens the model was trained for: answers past 32768 tokens may be "
        "poor; --context 32768 keeps to its training"
    ]
    small = serve_plan(ServePlanAsk(source=SOURCE, context=32768), BIG, 32768, [node("small", memory_gb=20)])
    assert small.ways == [] and small.warnings[0].startswith("no node has the memory for it at context 32768: write")


FLEET_WITH_CARDS = [node("gpu-1", cpus=32, memory_gb=256, cards=[l40s(count=2, free=2)])]


def test_serve_chooses_the_way_asked_and_the_cpu_profile_goes_below_the_cards():
    plan = serve_plan(ServePlanAsk(source=SOURCE, cores=8), BIG, 32768, FLEET_WITH_CARDS)
    ask = ServeModel(source=SOURCE, cpu=True, gpus=2, cores=8, replicas="gpu=7, cpu=4")
    card, cpu = choose_ways(plan, ask, fleet_cards=2)
    assert card.cards == 2 and cpu.kind == "cpu"
    model = served_model(ask, plan, card, cpu)
    assert model.name == "big-dense-q8_0" and model.context == 8192
    gpu_p, cpu_p = model.profiles
    assert (gpu_p.name, gpu_p.gpus, gpu_p.min_card_mb, gpu_p.priority, gpu_p.replicas) == (
        "gpu",
        2,
        card.memory_mb,
        1,
        7,
    )
    assert (cpu_p.name, cpu_p.gpus, cpu_p.host_memory_mb, cpu_p.cpu_cores, cpu_p.priority, cpu_p.replicas) == (
        "cpu",
        0,
        cpu.memory_mb,
        8,
        0,
        4,
    )
    assert (model.scaling.min, model.scaling.max) == (11, 11)
    best = choose_ways(plan, ServeModel(source=SOURCE), fleet_cards=2)
    assert best == (plan.ways[0], None) and best[0].cards == 1
    single = served_model(ServeModel(source=SOURCE, name="mine"), plan, *best)
    assert single.name == "mine" and [p.name for p in single.profiles] == ["gpu"] and single.scaling.max == 1


@pytest.mark.parametrize(
    ("ask", "fleet_cards", "message"),
    [
        pytest.param(
            ServeModel(source=SOURCE, gpus=1),
            0,
            "--gpus 1: no node of this fleet has a card; serve it on the CPU (--cpu)",
            id="gpus on a fleet without cards",
        ),
        pytest.param(
            ServeModel(source=SOURCE, gpus=4),
            2,
            "--gpus 4: no node has that many cards that hold it; write --gpus 1, 2",
            id="more cards than a node has",
        ),
        pytest.param(
            ServeModel(source=SOURCE, gpus=1, replicas="gpu=1,cpu=2"),
            2,
            "replicas: no profile cpu; this serve makes gpu; write gpu=1 (--cpu and --gpus N make both)",
            id="replicas of a profile it does not make",
        ),
        pytest.param(
            ServeModel(source=SOURCE, cpu=True, replicas={"cpu": 0}),
            2,
            "replicas: every count is zero; write at least one, as cpu=1",
            id="replicas that add up to nothing",
        ),
        pytest.param(
            ServeModel(source=SOURCE, cpu=True, replicas="cpu:4"),
            2,
            "replicas 'cpu:4': 'cpu:4' is not PROFILE=COUNT; write it as gpu=7,cpu=4",
            id="replicas that do not read",
        ),
    ],
)
def test_serve_refuses_what_the_fleet_cannot_do_saying_what_to_write(ask, fleet_cards, message):
    fleet = FLEET_WITH_CARDS if fleet_cards else [node("cpu-1")]
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, fleet)
    with pytest.raises(BadRequest) as caught:
        served_model(ask, plan, *choose_ways(plan, ask, fleet_cards))
    assert caught.value.message == message


@pytest.mark.parametrize(
    ("replicas", "counts"), [("gpu=7,cpu=4", {"gpu": 7, "cpu": 4}), ("", {}), ({"cpu": 2}, {"cpu": 2})]
)
def test_replicas_read_as_a_map_or_as_gpu_7_cpu_4(replicas, counts):
    assert parse_replicas(replicas) == counts


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("org/r@" + "0" * 40 + "/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct-q4_1"),
        ("demo/tiny/tiny.gguf", "tiny"),
    ],
)
def test_a_models_name_comes_from_its_file(source, name):
    assert default_name(source) == name


def card(memory_gb, count=1):
    return CardGroup(cls=f"card-{memory_gb}g", memory_mb=memory_gb * GIB, count=count, free=count)


def test_the_pool_is_fitted_to_the_card_when_the_default_context_does_not_fit_beside_the_weights():
    from llmgw.catalog.serve import fit_to_cards, plan_for_cards

    nodes = [node("g", cards=[card(20)])]
    ask = ServePlanAsk(source=SOURCE, slots=4)
    assert not [w for w in serve_plan(ask, BIG, 32768, nodes).ways if w.cards]  # 8192 tokens do not fit
    fitted = fit_to_cards(ask, BIG, 32768, nodes, gpus=1)
    assert 256 <= fitted < 8192 and fitted % 256 == 0
    plan = plan_for_cards(ask, BIG, 32768, nodes, gpus=1)
    assert plan.context == fitted and [w.cards for w in plan.ways if w.cards] == [1]
    assert (
        f"context fitted to the card: {fitted} tokens in 4 slot(s) (8192 would not fit 1 card(s)" in plan.warnings[-1]
    )
    assert not [
        w for w in serve_plan(msgspec.structs.replace(ask, context=fitted + 256), BIG, 32768, nodes).ways if w.cards
    ]


def test_an_explicit_context_that_does_not_fit_the_card_is_refused_with_the_one_that_would():
    from llmgw.catalog.serve import fit_to_cards, plan_for_cards

    nodes = [node("g", cards=[card(20)])]
    ask = ServePlanAsk(source=SOURCE, context=16384, slots=4)
    fitted = fit_to_cards(ask, BIG, 32768, nodes, gpus=1)
    with pytest.raises(
        BadRequest, match=rf"--gpus 1: at context 16384 the KV cache does not fit .* write --context {fitted},"
    ):
        plan_for_cards(ask, BIG, 32768, nodes, gpus=1)


def test_cards_too_small_for_the_weights_are_left_to_choose_ways_to_refuse():
    from llmgw.catalog.serve import plan_for_cards

    plan = plan_for_cards(ServePlanAsk(source=SOURCE), BIG, 32768, [node("g", cards=[card(8)])], gpus=1)
    with pytest.raises(BadRequest, match="no card of this fleet holds it"):
        choose_ways(plan, ServeModel(source=SOURCE, gpus=1), fleet_cards=1)


TWELVE_GB = [node("a", memory_gb=12), node("b", memory_gb=12), node("c", memory_gb=12)]


def test_a_model_no_node_holds_alone_is_offered_across_the_fewest_nodes_that_each_hold_a_share():
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, TWELVE_GB)
    assert [(w.kind, w.nodes) for w in plan.ways] == [("across-nodes", 2)] and plan.warnings == []
    way = plan.ways[0]
    assert way.memory_mb < 12 * GIB and way.weights_mb == -(-9_000_000_000 // 2**20)
    assert (way.nodes_fit, way.more_replicas, way.cards, way.threads) == (["a", "b", "c"], 1, 0, 32)
    one_node = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, [node("big")]).ways[0]
    assert 0 < way.tokens_per_s < one_node.tokens_per_s  # two halves one after the other, and a hop between
    assert way.mark == "slow" and way.reply_500_s == round(500 / way.tokens_per_s, 1)


def test_serving_across_nodes_makes_a_cpu_profile_of_that_many_nodes():
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, TWELVE_GB)
    for ask in (ServeModel(source=SOURCE), ServeModel(source=SOURCE, cpu=True)):
        card, cpu = choose_ways(plan, ask, fleet_cards=0)
        assert card is None and cpu.kind == "across-nodes"
        assert check_serve(cpu, plan, cpu_anyway=False)[0].startswith("Slow: about 11 tokens a second on the CPUs of 2")
        (profile,) = served_model(ask, plan, card, cpu).profiles
        assert (profile.name, profile.nodes, profile.host_memory_mb, profile.gpus) == ("cpu", 2, cpu.memory_mb, 0)
        assert profile.keep_within == ""


def test_no_way_across_nodes_is_offered_where_one_node_holds_the_model():
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, [node("a"), node("b")])
    assert [w.kind for w in plan.ways] == ["cpu"]


def test_a_very_slow_way_across_nodes_is_refused_without_cpu_anyway():
    slow = [node(n, memory_gb=12, all_gbs=8.0, one_gbs=1.0) for n in "ab"]
    plan = serve_plan(ServePlanAsk(source=SOURCE), BIG, 32768, slow)
    (way,) = plan.ways
    assert way.kind == "across-nodes" and way.mark == "very slow"
    with pytest.raises(BadRequest, match="tokens a second on the CPU, across 2 nodes: a reply of 500 tokens"):
        check_serve(way, plan, cpu_anyway=False)
    assert "(the CPU chosen on purpose)" in check_serve(way, plan, cpu_anyway=True)[0]


def test_a_judges_plan_says_how_soon_a_verdict_comes_and_puts_the_way_within_the_bound_first():
    from llmgw.modelplan import JUDGE_BOUND_S

    small = msgspec.structs.replace(BIG, shape=msgspec.structs.replace(BIG.shape, parameters=135_000_000))
    fleet = [node("cpu-1"), node("gpu-1", cards=[l40s(count=1, free=1)])]
    chat = serve_plan(ServePlanAsk(source=SOURCE, cores=4), small, 0, fleet)
    judge = serve_plan(ServePlanAsk(source=SOURCE, cores=4, judge=True), small, 0, fleet)
    assert all(w.prefill_tokens_per_s > 0 and w.verdict_s > 0 for w in judge.ways)
    card, cpu = judge.ways[0], next(w for w in judge.ways if w.kind == "cpu")
    assert card.kind == "gpu" and card.prefill_tokens_per_s > 50 * cpu.prefill_tokens_per_s
    assert {w.kind for w in chat.ways} == {w.kind for w in judge.ways}
    # A CPU way within the bound is put before cards: a judge need not take one.
    within = [w for w in judge.ways if w.verdict_s <= JUDGE_BOUND_S]
    assert judge.ways[0] in within and not judge.warnings

    big = serve_plan(ServePlanAsk(source=SOURCE, cores=4, judge=True), BIG, 0, [node("cpu-1")])
    assert big.ways[0].verdict_s > JUDGE_BOUND_S
    assert any("no way gives a verdict within 1 s" in w for w in big.warnings), big.warnings


def test_a_model_of_experts_larger_than_the_card_is_offered_on_it_with_experts_on_the_cpu():
    fleet = [node("box", cpus=16, memory_gb=128, all_gbs=60.0, one_gbs=12.0, cards=[rtx4090()])]
    plan = serve_plan(ServePlanAsk(source=SOURCE, cores=8), MOE_FILE, 131072, fleet)
    card, cpu = plan.ways
    assert (card.kind, card.cards, card.card_class) == ("gpu", 1, "rtx4090-24g")
    assert 0 < card.experts_on_cpu < MOE.layers and card.memory_mb <= 24 * GIB
    assert card.host_mb == experts_on_host_mb(MOE, card.experts_on_cpu) and card.nodes_fit == ["box"]
    assert card.more_replicas == 1 and card.tokens_per_s > cpu.tokens_per_s and cpu.kind == "cpu"
    assert card.weights_mb == -(-(MOE.weight_bytes - experts_host_bytes(MOE, card.experts_on_cpu)) // 2**20)
    chosen, _ = choose_ways(plan, ServeModel(source=SOURCE), fleet_cards=1)
    assert chosen is card
    assert check_serve(card, plan, cpu_anyway=False) == []  # fast enough to say nothing
    slow_host = [node("box", cpus=16, memory_gb=128, all_gbs=20.0, one_gbs=4.0, cards=[rtx4090()])]
    slow = serve_plan(ServePlanAsk(source=SOURCE, cores=8), MOE_FILE, 131072, slow_host)
    (said,) = check_serve(slow.ways[0], slow, cpu_anyway=False)
    assert said.startswith("Slow: about") and f"the experts of {slow.ways[0].experts_on_cpu} layers on its CPU" in said
    (profile,) = served_model(ServeModel(source=SOURCE, cores=8), plan, card, None).profiles
    assert (profile.gpus, profile.cpu_moe_layers, profile.cpu_cores) == (1, card.experts_on_cpu, 8)
    assert profile.host_memory_mb is None  # placement works the experts' memory out from the header


def rtx4090(count=1, free=1):
    return CardGroup(cls="rtx4090-24g", memory_mb=24 * GIB, count=count, free=free)
