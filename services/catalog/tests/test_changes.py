"""Operator changes as a tagged union: each kind carries only its own fields, on the same flat wire."""

import msgspec
import pytest

from llmgw.bus import BadRequest
from llmgw.catalog.edits import apply_change
from llmgw.proto import Model, ModelChange, Profile, Scaling
from llmgw.proto.catalog import (
    ChangeSpec,
    RestartModel,
    ScaleModel,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    StartModel,
    StopModel,
)

TWO = Model(name="m", source="o/r/m.gguf", profiles=[Profile(name="gpu", gpus=1, priority=10), Profile(name="cpu")])


def test_a_scale_on_the_wire_is_flat_with_the_action_first_and_only_its_own_fields():
    change = ScaleModel(name="m", by="ops", scaling=Scaling(min=1, max=2))
    assert list(msgspec.json.decode(msgspec.json.encode(change)).items()) == list(
        {
            "action": "scale",
            "name": "m",
            "by": "ops",
            "revision": None,
            "scaling": {"min": 1, "max": 2, "idle_timeout_s": None, "schedule": []},
        }.items()
    )


@pytest.mark.parametrize(
    ("wire", "kind"),
    [
        ({"action": "stop"}, StopModel),
        ({"action": "start"}, StartModel),
        ({"action": "restart", "in_place": True}, RestartModel),
        ({"action": "scale", "scaling": {"min": 0, "max": 1}}, ScaleModel),
        ({"action": "replicas", "counts": {"gpu": 2}}, SetReplicas),
        ({"action": "context", "context": 8192}, SetContext),
        ({"action": "gpus", "gpus": {"gpu": 2}}, SetGpus),
        ({"action": "class", "capacity_class": "batch"}, SetClass),
        ({"action": "owner", "owner": "ml"}, SetOwner),
        ({"action": "alias", "add_aliases": ["x"]}, SetAliases),
    ],
)
def test_every_action_of_today_decodes_to_its_own_kind(wire, kind):
    change = msgspec.convert({**wire, "name": "m", "by": "ops"}, ModelChange)
    assert type(change) is kind and isinstance(change, ChangeSpec) and change.name == "m"


def test_a_flat_message_from_an_older_sender_still_decodes_keeping_the_fields_its_action_reads():
    old = {
        "action": "replicas",
        "scaling": None,
        "counts": {"gpu": 3},
        "cpu_memory_mb": 8000,
        "cpu_cores": None,
        "context": None,
        "max_output": None,
        "gpus": {},
        "capacity_class": None,
        "owner": None,
        "add_aliases": [],
        "remove_aliases": [],
        "in_place": False,
        "revision": 4,
        "name": "m",
        "by": "ctl",
    }
    change = msgspec.convert(old, ModelChange)
    assert change == SetReplicas(name="m", by="ctl", revision=4, counts={"gpu": 3}, cpu_memory_mb=8000)


@pytest.mark.parametrize(
    ("wire", "field"),
    [
        ({"action": "scale"}, "scaling"),
        ({"action": "class"}, "capacity_class"),
        ({"action": "class", "capacity_class": "gold"}, "$.capacity_class"),
        ({"action": "stop", "name": "a b"}, "$.name"),
        ({"action": "grow"}, "action"),
    ],
)
def test_a_change_missing_what_its_action_needs_is_refused_naming_the_field(wire, field):
    with pytest.raises(msgspec.ValidationError, match=field.replace("$", r"\$").replace(".", r"\.")):
        msgspec.convert({"name": "m", **wire}, ModelChange)


def test_a_change_needs_the_models_name():
    with pytest.raises(msgspec.ValidationError, match="name"):
        msgspec.convert({"action": "stop"}, ModelChange)


def test_the_core_applies_each_kind():
    assert apply_change(TWO, StopModel(name="m")).stopped == TWO.scaling
    assert apply_change(TWO, ScaleModel(name="m", scaling=Scaling(min=2, max=3))).scaling == Scaling(min=2, max=3)
    assert apply_change(TWO, SetClass(name="m", capacity_class="batch")).capacity_class == "batch"
    assert apply_change(TWO, SetOwner(name="m", owner="ml")).owner == "ml"
    assert apply_change(TWO, SetAliases(name="m", add_aliases=["x"])).aliases == ["x"]
    assert apply_change(TWO, SetContext(name="m", max_output=100)).max_output == 100
    assert apply_change(TWO, RestartModel(name="m", in_place=True)).rollout == "in-place"


def test_a_change_that_breaks_a_rule_is_refused_by_the_core():
    with pytest.raises(BadRequest, match="min 3 is above max 1"):
        apply_change(TWO, ScaleModel(name="m", scaling=Scaling(min=3, max=1)))
