"""The order a pass places models in: within a class the lightest first (a fast node gains it
most), and where that leaves replicas unplaced, another try with those models first."""

import itertools

from fake_nodes import GB, NOW, Node

from llmgw.proto import Model, Profile
from llmgw.scheduler.core import Actual, Desired, Policy, reconcile


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
