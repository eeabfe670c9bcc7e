"""The order a pass places models in: within a class the lightest first (a fast node gains it
most), and where that leaves replicas unplaced, another try with those models first (on the
slowest room that fits them); then a small try's starts moved or traded where they answer faster."""

import itertools

from fake_nodes import GB, NOW, Node, states

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core import Actual, Desired, Plan, Policy, Start, improve, reconcile
from llmgw.scheduler.placement import cards_for, claim, need_of, speed_of


def _model(name, profile):
    return Model(name=name, source=f"o/{name}/m.gguf", profiles=[profile])


def _pass(models, sizes, nodes, policy=Policy()):
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
    one = _pass(models, sizes, nodes, Policy(tries=1))
    assert [(s.replica.model, s.replica.node) for s in one.starts] == [("light", "big")]
    assert "memory: needs" in one.unplaced["heavy"]
    plan = _pass(models, sizes, nodes)
    assert [(s.replica.model, s.replica.node) for s in plan.starts] == [("heavy", "big"), ("light", "small")]
    assert [s.replica.id for s in plan.starts] == ["r0", "r1"] and not plan.unplaced


def test_a_try_that_places_no_more_keeps_the_speed_order():
    cpu = Profile(name="cpu")
    models = [_model("heavy", cpu), _model("light", cpu)]
    nodes = [Node("only").memory(8).membw(200, 10)]
    plan = _pass(models, {"heavy": 28 * GB, "light": GB}, nodes)
    assert [(s.replica.model, s.replica.node) for s in plan.starts] == [("light", "only")]
    assert set(plan.unplaced) == {"heavy"}


def test_a_model_put_first_takes_the_slowest_room_that_fits_it():
    card = Profile(name="gpu", gpus=1)
    models = [_model("heavy", card), _model("light-a", card), _model("light-b", card)]
    nodes = [Node("fast").cards(1), Node("mid").cards(1, "a100-40g", 40960), Node("slow").cards(1, "l4-24g", 23034)]
    sizes = {"heavy": 30 * GB, "light-a": GB, "light-b": GB}  # heavy fits "fast" or "mid", not "slow"
    plan = _pass(models, sizes, nodes)
    # put first after the speed order left it unplaced, it no longer takes "fast" from a light model
    placed = {s.replica.model: s.replica.node for s in plan.starts}
    assert placed == {"heavy": "mid", "light-a": "fast", "light-b": "slow"} and not plan.unplaced


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
