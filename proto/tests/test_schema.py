"""The contracts: the golden schema, and what validation says of bad messages."""

import re
from pathlib import Path

import msgspec
import pytest

from llmgw.proto import Model, ModelPut, Profile, fingerprint, schema_json, subjects_markdown

GOLDEN = Path(__file__).parents[1] / "schema" / "llmgw.v1.json"
SUBJECTS = Path(__file__).parents[2] / "docs" / "subjects.md"


def test_the_schema_matches_the_golden_file():
    assert schema_json() == GOLDEN.read_bytes(), "run `just proto-schema` and review the diff"


def test_docs_subjects_is_generated_from_the_endpoint_tables():
    assert subjects_markdown() == SUBJECTS.read_text(), "run `just proto-schema` and review the diff"


def test_a_model_gets_one_cpu_profile_and_scaling_one_by_default():
    model = msgspec.json.decode(b'{"name": "m", "source": "o/r/f.gguf"}', type=Model)
    assert [p.name for p in model.profiles] == ["cpu"]
    assert model.scaling.min == 1 and model.profiles[0].engine == "llamacpp"


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (b'{"model": {"name": "a.b", "source": "o/r/f"}}', "$.model.name"),
        (b'{"model": {"name": "m", "source": "../etc/passwd"}}', "$.model.source"),
        (b'{"model": {"name": "m", "source": "o/r/f", "context": 5}}', "$.model.context"),
        (b'{"model": {"name": "m", "source": "o/r/f", "scaling": {"min": -1}}}', "$.model.scaling.min"),
        (b'{"model": {"name": "m", "source": "o/r/f", "profiles": [{"engine": "tgi"}]}}', "$.model.profiles[0].engine"),
    ],
)
def test_an_invalid_message_is_refused_naming_the_field(payload, where):
    with pytest.raises(msgspec.ValidationError, match=re.escape(f"at `{where}`")):
        msgspec.json.decode(payload, type=ModelPut)


def test_fields_added_later_leave_running_replicas_fingerprints_as_they_were():
    """Pinned: these were the fingerprints before `nodes` and `keep_within` existed."""
    model = Model(name="a", source="x/y.gguf", profiles=[Profile(), Profile(name="g", gpus=2)])
    assert [fingerprint(model, p) for p in model.profiles] == ["e8ebdaa3cb42e74b", "63c9ae602ccf137a"]
    spans = msgspec.structs.replace(model.profiles[0], nodes=2)
    assert fingerprint(model, spans) != "e8ebdaa3cb42e74b"
    experts = msgspec.structs.replace(model.profiles[1], cpu_moe_layers=4)
    assert fingerprint(model, experts) != "63c9ae602ccf137a"


def test_keep_within_must_be_a_label_name():
    with pytest.raises(msgspec.ValidationError, match=re.escape("at `$.profiles[0].keep_within`")):
        msgspec.json.decode(
            b'{"name": "m", "source": "o/r/f.gguf", "profiles": [{"keep_within": "Rack 1"}]}', type=Model
        )


def test_an_event_subject_says_which_node_it_speaks_for():
    from llmgw.proto import agent

    assert agent.REPLICA_CHANGED.parse(agent.REPLICA_CHANGED.subject("a", "r1")) == ("a", "r1")
    assert agent.HEARTBEAT.parse(agent.HEARTBEAT.subject("b")) == ("b",)
    assert agent.HEARTBEAT.parse("llmgw.v1.evt.node.heartbeat.b.extra") is None
    assert agent.HEARTBEAT.parse("llmgw.v1.evt.replica.a.r1") is None
