"""The order a pass places models in: within a class the lightest first (a fast node gains it
most); where that leaves a replica unplaced, starts moved off a node to make room for it, and
another try with those models first (on the slowest room that fits them); then a small try's
starts moved or traded where they answer faster."""

import itertools

import msgspec

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core import Actual, Desired, Plan, Policy, Start, _reconcile, improve, reconcile
from llmgw.scheduler.placement import cards_for, claim, need_of, speed_of
from services.scheduler.tests.fake_nodes import GB, NOW, Node, states


def _model(name, profile):
    return Model(name=name, source=f"o/{name}/m.gguf", profiles=[profile])


def _pass(models, sizes, nodes, policy=Policy()):
    """A pass of the greedy order, its tries and moves (what they do alone: the exact placement
    where capacity binds, test_exact.py, is left out)."""
    policy = msgspec.structs.replace(policy, exact=0)
    ids = (f"r{i}" for i in itertools.count())
    weights = {m.source: sizes[m.name] for m in models}
    actual = Actual(nodes={n.info.node: n.view() for n in nodes}, weights=weights)
    return reconcile(Desired(models={m.name: m for m in models}), actual, NOW, policy, ids=ids)


def test_the_lightest_model_takes_the_fastest_card_whatever_its_name():
    card = Profile(name="gpu", gpus=1)
    models = [_model("a-heavy", card), _model("z-light", card)]
    nodes = [Node("fast").cards(1), Node("slow").cards(1, "l4-24g", 23034)]
    plan = _pass(models, {"a-heavy": 16 * GB, "z-light": GB}, nodes)
    assert {s.replica.model: s.replica.node for s in plan.starts} == {"z-light": "fast", "a-heavy": "slow"}
    assert [s.replica.id for s in plan.starts] == ["r0", "r1"] and not plan.unplaced


def test_a_model_the_speed_order_leaves_unplaced_goes_first_in_another_try():
    cpu = Profile(name="cpu")
    models = [_model("heavy", cpu), _model("light", cpu)]
    nodes = [Node("big").memory(32).membw(200, 10), Node("small").memory(8).membw(50, 5)]
    sizes = {"heavy": 30 * GB, "light": GB}  # on "big", one or the other
    one = _pass(models, sizes, nodes, Policy(tries=1, improve=0))  # no room made by moves either
    assert [(s.replica.model, s.replica.node) for s in one.starts] == [("light", "big")]
    assert "memory: needs" in one.unplaced["heavy"]
    plan = _pass(models, sizes, nodes, Policy(improve=0))
    assert [(s.replica.model, s.replica.node) for s in plan.starts] == [("heavy", "big"), ("light", "small")]
    assert [s.replica.id for s in plan.starts] == ["r0", "r1"] and not plan.unplaced


def test_a_try_that_places_no_more_keeps_the_speed_order():
    cpu = Profile(name="cpu")
    models = [_model("heavy", cpu), _model("light", cpu)]
    nodes = [Node("only").memory(8).membw(200, 10)]
    plan = _pass(models, {"heavy": 28 * GB, "light": GB}, nodes)
    assert [(s.replica.model, s.replica.node) for s in plan.starts] == [("light", "only")]
    assert set(plan.unplaced) == {"heavy"}


def test_a_start_moves_off_the_only_node_a_model_left_unplaced_fits():
    cpu = Profile(name="cpu")
    models = [_model("heavy", cpu), _model("light", cpu)]
    nodes = [Node("big").memory(32).membw(200, 10), Node("small").memory(8).membw(50, 5)]
    plan = _pass(models, {"heavy": 30 * GB, "light": GB}, nodes, Policy(tries=1))  # in the first try
    assert {s.replica.model: s.replica.node for s in plan.starts} == {"light": "small", "heavy": "big"}
    assert [s.replica.id for s in plan.starts] == ["r0", "r1"] and not plan.unplaced


def test_room_made_on_the_cpu_keeps_the_fast_card_for_the_light_model():
    # The heavy model's card profile comes first. It is left unplaced: a light model has the
    # only card, and a CPU model the cores of the only node its CPU profile fits. Put first, it
    # would take the card and send the light model to the CPU (the same count, far fewer tokens
    # a second); the CPU model moving to another node makes it room on the CPU instead.
    card, cpu = Profile(name="gpu", gpus=1, priority=10), Profile(name="cpu", cpu_cores=16)
    heavy = Model(name="heavy", source="o/heavy/m.gguf", profiles=[card, cpu])
    light = Model(name="light", source="o/light/m.gguf", profiles=[card, Profile(name="cpu", cpu_cores=4)])
    models = [heavy, light, _model("mid", cpu)]
    nodes = [
        Node("cards").memory(16).membw(100, 8).cards(1),
        Node("big").memory(64).membw(300, 10),
        Node("small").memory(8).membw(150, 8),
    ]
    plan = _pass(models, {"heavy": 30 * GB, "light": GB, "mid": 4 * GB}, nodes)
    placed = {s.replica.model: (s.replica.profile, s.replica.node) for s in plan.starts}
    assert placed["light"] == ("gpu", "cards") and placed["heavy"] == ("cpu", "big") and placed["mid"][1] != "big"
    assert not plan.unplaced
    no_moves = _pass(models, {"heavy": 30 * GB, "light": GB, "mid": 4 * GB}, nodes, Policy(improve=0))
    assert {s.replica.model: s.replica.profile for s in no_moves.starts} == {
        "heavy": "gpu",
        "light": "cpu",
        "mid": "cpu",
    }


def test_a_model_put_first_takes_the_slowest_room_that_fits_it():
    card = Profile(name="gpu", gpus=1)
    models = [_model("heavy", card), _model("light-a", card), _model("light-b", card)]
    nodes = [Node("fast").cards(1), Node("mid").cards(1, "a100-40g", 40960), Node("slow").cards(1, "l4-24g", 23034)]
    sizes = {"heavy": 30 * GB, "light-a": GB, "light-b": GB}  # heavy fits "fast" or "mid", not "slow"
    plan = _pass(models, sizes, nodes)
    # put first after the speed order left it unplaced, it no longer takes "fast" from a light model
    placed = {s.replica.model: s.replica.node for s in plan.starts}
    assert placed == {"heavy": "mid", "light-a": "fast", "light-b": "slow"} and not plan.unplaced


def test_a_start_falls_back_to_its_next_profile_to_make_room_for_a_card_only_model():
    card = Profile(name="gpu", gpus=1, priority=10)
    light = Model(name="light", source="o/light/m.gguf", profiles=[card, Profile(name="cpu")])
    models = [light, _model("card-only", card)]
    nodes = [Node("cards").cards(1), Node("cpu").membw(200, 10)]
    plan = _pass(models, {"light": GB, "card-only": 16 * GB}, nodes, Policy(tries=1))  # in the first try
    placed = {s.replica.model: (s.replica.profile, s.replica.node, s.replica.gpus) for s in plan.starts}
    assert placed == {"light": ("cpu", "cpu", []), "card-only": ("gpu", "cards", ["cards-gpu0"])}
    assert not plan.unplaced
    light_start = next(s for s in plan.starts if s.replica.model == "light")
    assert light_start.profile.name == "cpu" and light_start.replica.memory_mb > 0
    # its record is the fallback profile's: the next pass finds nothing stale
    running = [msgspec.structs.replace(s.replica, state="ready") for s in plan.starts]
    actual = Actual(
        nodes={n.info.node: n.view() for n in nodes},
        replicas=running,
        weights={light.source: GB, models[1].source: 16 * GB},
    )
    ids = (f"s{i}" for i in itertools.count())
    steady = reconcile(Desired(models={m.name: m for m in models}), actual, NOW, Policy(), ids=ids)
    assert not steady.starts and not steady.stops


def _started(plan, states, model, node, size):
    need = need_of(model.profiles[0], size)
    r = ReplicaState(
        id=f"r-{model.name}",
        model=model.name,
        profile=model.profiles[0].name,
        node=node,
        memory_mb=need.memory_mb,
        gpus=cards_for(need, states[node]),
        tokens_per_s=round(speed_of(need, states[node]), 1),
        updated=NOW,
    )
    claim(states, r)
    plan.starts.append(Start(replica=r, model=model, profile=model.profiles[0]))


def test_two_replicas_trade_places_where_together_they_answer_faster():
    card = Profile(name="gpu", gpus=1)
    heavy, light = _model("heavy", card), _model("light", card)
    nodes = states(Node("fast").cards(1), Node("slow").cards(1, "l4-24g", 23034))
    plan = Plan()
    _started(plan, nodes, heavy, "fast", 16 * GB)  # as a greedy pass may leave them
    _started(plan, nodes, light, "slow", GB)
    before = sum(s.replica.tokens_per_s for s in plan.starts)
    improve(plan, nodes, NOW, Policy(), {heavy.source: 16 * GB, light.source: GB}, {})
    after = {s.replica.model: (s.replica.node, s.replica.gpus) for s in plan.starts}
    assert after == {"heavy": ("slow", ["slow-gpu0"]), "light": ("fast", ["fast-gpu0"])}
    assert sum(s.replica.tokens_per_s for s in plan.starts) > before
    assert not nodes["fast"].free_cards and not nodes["slow"].free_cards  # the room follows the replicas
    assert [s.replica.id for s in plan.starts] == ["r-heavy", "r-light"]


def test_a_replica_moves_to_faster_free_room_but_not_away_from_its_file():
    cpu = Profile(name="cpu")
    model = _model("m", cpu)
    nodes = states(Node("slow").membw(40, 8), Node("fast").membw(300, 10))
    plan = Plan()
    _started(plan, nodes, model, "slow", GB)
    improve(plan, nodes, NOW, Policy(), {model.source: GB}, {})
    assert plan.starts[0].replica.node == "fast"
    assert nodes["slow"].free_mb > nodes["fast"].free_mb
    held = states(Node("slow").membw(40, 8).holding(model.source), Node("fast").membw(300, 10))
    plan = Plan()
    _started(plan, held, model, "slow", GB)
    improve(plan, held, NOW, Policy(), {model.source: GB}, {})
    assert plan.starts[0].replica.node == "slow"


def test_a_pass_orders_only_the_models_that_move_and_leaves_the_settled_ones_alone(monkeypatch):
    # whether a model runs as it should does not hang on the others: a steady pass of 10,000
    # nodes sorted thousands of models to start nothing
    ordered = []
    turn = _reconcile._turn
    monkeypatch.setattr(_reconcile, "_turn", lambda model, *rest: ordered.append(model.name) or turn(model, *rest))
    cpu = Profile(name="cpu")
    models = [_model(f"m{i}", cpu) for i in range(5)]
    nodes = [Node(f"n{i}").membw(200, 10) for i in range(3)]
    sizes = {m.name: GB for m in models} | {"new": GB}
    plan = _pass(models, sizes, nodes)
    running = [msgspec.structs.replace(s.replica, state="ready") for s in plan.starts]
    weights = {m.source: GB for m in models} | {"o/new/m.gguf": GB}
    actual = Actual(nodes={n.info.node: n.view() for n in nodes}, replicas=running, weights=weights)
    ordered.clear()
    steady = reconcile(Desired(models={m.name: m for m in models}), actual, NOW, Policy(), ids=iter(()))
    assert not steady.starts and not steady.stops and ordered == []
    new = _model("new", cpu)
    grown = reconcile(Desired(models={m.name: m for m in [*models, new]}), actual, NOW, Policy(), ids=iter(["x"]))
    assert [(s.replica.id, s.replica.model) for s in grown.starts] == [("x", "new")] and not grown.stops
    assert set(ordered) == {"new"}
