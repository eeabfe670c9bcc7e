"""The rule that makes the CPU a choice made on purpose, as a table: each way refused with these
words or taken with these warnings; and each plan way saying whether it takes `cpu_anyway`."""

import pytest

from llmgw.bus import BadRequest
from llmgw.catalog.serve import check_serve, takes_cpu_anyway
from llmgw.proto.catalog import ServePlan, ServeWay
from services.catalog.tests.serve_fleet import SOURCE


def cpu_way(tps, node_name="big"):
    return ServeWay(kind="cpu", threads=4, memory_mb=20_000, node=node_name, nodes_fit=[node_name], tokens_per_s=tps)


def card_way(tps=90.0, nodes=("gpu-1",)):
    return ServeWay(kind="gpu", cards=1, card_class="l40s-48g", node="gpu-1", nodes_fit=list(nodes), tokens_per_s=tps)


def plan_of(*ways):
    return ServePlan(source=SOURCE, context=4096, ways=list(ways))


# The rule: (the way, the plan's other ways, cpu_anyway) -> refused with these words, or taken with these warnings.
VERY_SLOW = (
    f"{SOURCE} would answer at about 1.8 tokens a second on the CPU, at best on big: a reply of 500 tokens in "
    "about 5 minutes. To serve it, serve it on a card (--gpus 1; gpus in the API), or say the CPU is on "
    "purpose (--cpu-anyway; cpu_anyway)"
)
FREE_CARDS = (
    f"{SOURCE} on the CPU while cards that fit it are free (l40s-48g on gpu-1, gpu-2): on one it answers at "
    "about 90 tokens a second, against 40.0 on the CPU. To serve it, serve it on a card (--gpus 1; gpus in "
    "the API), or say the CPU is on purpose (--cpu-anyway; cpu_anyway)"
)
RULE = [
    pytest.param(cpu_way(1.8), [], False, VERY_SLOW, None, id="very slow on the CPU, no cards: refused"),
    pytest.param(cpu_way(1.8), [card_way()], False, VERY_SLOW, None, id="very slow on the CPU, cards free: refused"),
    pytest.param(
        cpu_way(1.8), [card_way(nodes=())], False, VERY_SLOW, None, id="very slow on the CPU, cards busy: refused"
    ),
    pytest.param(
        cpu_way(1.8),
        [],
        True,
        None,
        [
            "Very slow: about 1.8 tokens a second on the CPU of big: a reply of 500 tokens takes about 5 minutes "
            "(the CPU chosen on purpose)"
        ],
        id="very slow on the CPU with cpu_anyway: taken, warned in minutes",
    ),
    pytest.param(
        cpu_way(40.0),
        [card_way(nodes=("gpu-1", "gpu-2"))],
        False,
        FREE_CARDS,
        None,
        id="the CPU while cards that fit are free: refused, naming them",
    ),
    pytest.param(
        cpu_way(40.0),
        [card_way(nodes=("gpu-1", "gpu-2"))],
        True,
        None,
        ["on the CPU on purpose while cards that fit it are free (l40s-48g on gpu-1, gpu-2)"],
        id="the CPU while cards are free, with cpu_anyway: taken, warned",
    ),
    pytest.param(cpu_way(40.0), [card_way(nodes=())], False, None, [], id="the CPU with every card busy: taken"),
    pytest.param(
        cpu_way(10.0),
        [],
        False,
        None,
        ["Slow: about 10 tokens a second on the CPU of big: a reply of 500 tokens takes about 50 seconds"],
        id="slow on the CPU: taken, warned in seconds",
    ),
    pytest.param(
        card_way(12.5),
        [],
        False,
        None,
        ["Slow: about 12 tokens a second on 1x l40s-48g of gpu-1: a reply of 500 tokens takes about 40 seconds"],
        id="slow on a card: taken, warned in seconds",
    ),
    pytest.param(card_way(90.0), [cpu_way(1.0)], False, None, [], id="a fast card: taken, nothing said"),
    pytest.param(
        cpu_way(0.0),
        [],
        False,
        None,
        ["speed unknown on the CPU of big: its agent has not measured the memory's rate yet"],
        id="an unmeasured node: taken, the speed said unknown",
    ),
]


@pytest.mark.parametrize(("way", "others", "anyway", "refused", "warned"), RULE)
def test_the_cpu_is_a_choice_made_on_purpose(way, others, anyway, refused, warned):
    plan = plan_of(way, *others)
    if refused:
        with pytest.raises(BadRequest) as caught:
            check_serve(way, plan, anyway)
        assert caught.value.message == refused
    else:
        assert check_serve(way, plan, anyway) == warned


@pytest.mark.parametrize(("way", "others", "anyway", "refused", "warned"), RULE)
def test_each_way_says_whether_it_takes_cpu_anyway_exactly_where_serving_it_alone_is_refused_without(
    way, others, anyway, refused, warned
):
    plan = plan_of(way, *others)
    try:
        check_serve(way, plan, cpu_anyway=False)
        refused_without = False
    except BadRequest:
        refused_without = True
    assert takes_cpu_anyway(way, plan.ways) is refused_without


def test_a_cpu_profile_below_the_cards_is_not_refused_for_the_free_cards_but_still_for_being_very_slow():
    plan = plan_of(cpu_way(40.0), card_way())
    assert check_serve(plan.ways[0], plan, cpu_anyway=False, alone=False) == []
    with pytest.raises(BadRequest, match="1.8 tokens a second on the CPU"):
        check_serve(cpu_way(1.8), plan, cpu_anyway=False, alone=False)
