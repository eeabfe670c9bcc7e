"""Where capacity binds, the exact placement (an integer program solved by HiGHS): the most
replicas placed, a higher class never giving way to a lower one, then the most tokens a second;
its result checked by the filter chain and kept only where it ranks above the greedy try's."""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.proto import Model, Profile, Scaling
from llmgw.scheduler.core import Actual, Desired, Policy, highs, reconcile
from llmgw.scheduler.placement import claim
from services.scheduler.tests.fake_nodes import GB, NOW, Node, states

CARD = Profile(name="gpu", gpus=1, priority=10)


def _model(name: str, replicas: int, *profiles: Profile, cls: str = "standard") -> Model:
    return Model(
        name=name,
        source=f"o/{name}/m.gguf",
        profiles=list(profiles),
        scaling=Scaling(min=replicas, max=replicas),
        capacity_class=cls,
    )


def _pass(models, sizes, nodes, policy=Policy(), solver=highs):
    ids = (f"r{i}" for i in itertools.count())
    weights = {m.source: sizes[m.name] for m in models}
    actual = Actual(nodes={n.info.node: n.view() for n in nodes}, weights=weights)
    return reconcile(Desired(models={m.name: m for m in models}), actual, NOW, policy, ids=ids, solver=solver)


def _fleet():
    # Two cards and 48 cores. "big" wants three replicas (a card, or 16 cores); "cards" has
    # no CPU profile. The speed order gives "big" both cards, and no try or move gives one back.
    models = [
        _model("light", 2, CARD, Profile(name="cpu", cpu_cores=4)),
        _model("mid", 1, CARD, Profile(name="cpu", cpu_cores=8)),
        _model("big", 3, CARD, Profile(name="cpu", cpu_cores=16)),
        _model("cards", 1, CARD),
    ]
    sizes = {"light": GB, "mid": 8 * GB, "big": 18 * GB, "cards": 18 * GB}
    nodes = [
        Node("gpus").cpus(32).memory(256).membw(111, 11).cards(2, "l40s-48g", 46068),
        Node("cpus").cpus(16).memory(64).membw(229, 8),
    ]
    return models, sizes, nodes


def _placed(plan):
    return sorted((s.replica.model, s.replica.profile, s.replica.node) for s in plan.starts)


def test_where_the_greedy_try_leaves_a_model_out_the_exact_placement_starts_every_replica():
    models, sizes, nodes = _fleet()
    greedy = _pass(models, sizes, nodes, Policy(exact=0))
    assert len(greedy.starts) == 6 and set(greedy.unplaced) == {"cards"}  # the case this is for
    plan = _pass(models, sizes, nodes)
    assert not plan.unplaced and len(plan.starts) == 7
    assert ("cards", "gpu", "gpus") in _placed(plan)
    assert sum(s.replica.model == "big" and s.replica.profile == "gpu" for s in plan.starts) == 1
    held = states(*nodes)
    for s in plan.starts:  # every start passes the filter chain with the others placed
        claim(held, s.replica)
    for n in held.values():
        assert n.cores_held <= n.info.cpus and n.free_mb >= 0
    cards = [g for s in plan.starts for g in s.replica.gpus]
    assert len(cards) == len(set(cards)) == 2
    assert len({s.replica.id for s in plan.starts}) == 7


def test_a_batch_model_never_takes_the_room_of_a_critical_one_to_place_more():
    # Two cards and 16 cores: the critical model on both cards and one batch replica on the
    # cores, or three batch replicas (a card each and the cores). More replicas would place
    # with the batch model alone; a higher class counts first.
    two = Profile(name="gpu", gpus=2, priority=10)
    models = [
        _model("crit", 1, two, cls="critical"),
        _model("batch", 3, CARD, Profile(name="cpu", cpu_cores=16), cls="batch"),
    ]
    nodes = [Node("n").cpus(16).memory(128).membw(200, 10).cards(2, "l40s-48g", 46068)]
    plan = _pass(models, {"crit": 8 * GB, "batch": 8 * GB}, nodes)
    assert _placed(plan) == [("batch", "cpu", "n"), ("crit", "gpu", "n")]
    assert list(plan.unplaced) == ["batch"]


def test_a_roomy_fleet_never_asks_the_solver(monkeypatch):
    import llmgw.scheduler.core._exact as exact

    monkeypatch.setattr(exact, "_solve", lambda *a: pytest.fail("solved a pass that placed everything"))
    models, sizes, nodes = _fleet()
    nodes.append(Node("more").cpus(64).memory(256).membw(150, 8).cards(4, "l40s-48g", 46068))
    plan = _pass(models, sizes, nodes)
    assert len(plan.starts) == 7 and not plan.unplaced


@pytest.mark.parametrize("maker", ["highs", "quiet_highs"])
def test_only_the_shells_solver_maker_keeps_the_highs_banner_off_stdout(maker):
    # HiGHS prints its banner on fd 1, from C, when a process makes its first solver, before any
    # option can turn it off; a scheduler's stdout goes to its log. The core's plain maker
    # prints it (the check can fail); the shell's, which the scheduler passes, does not.
    code = (
        "from llmgw.scheduler.core import highs\n"
        "from llmgw.scheduler.solver import quiet_highs\n"
        "from services.scheduler.tests.test_exact import _fleet, _pass\n"
        "for _ in range(2):\n"
        f"    assert not _pass(*_fleet(), solver={maker}).unplaced\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("HiGHS" in done.stdout) == (maker == "highs"), done.stdout
