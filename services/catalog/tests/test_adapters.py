"""A model's LoRA adapters as the catalog changes them, without I/O: attached, replaced,
detached, bounded, refused where they cannot load; what restarts replicas (the fingerprint) and
what a purge deletes."""

import msgspec
import pytest

from llmgw.bus import BadRequest
from llmgw.catalog.core import check_model, files_to_purge
from llmgw.catalog.edits import apply_change
from llmgw.proto import Adapter, Model, Profile, SetAdapters, fingerprint
from llmgw.proto.catalog import MOST_ADAPTERS, adapter_name

BASE = Model(name="m", source="o/m@" + "a" * 40 + "/m.gguf")
SQL = Adapter(name="sql", source="o/sql@" + "b" * 40 + "/sql.gguf")
LEGAL = Adapter(name="legal", source="o/legal@" + "c" * 40 + "/legal.gguf", scale=0.5)


def change(model: Model, **fields) -> Model:
    return apply_change(model, SetAdapters(name=model.name, **fields))


def test_adapters_are_attached_replaced_by_name_and_detached_by_name_or_file():
    both = change(BASE, add=[SQL, LEGAL])
    assert [a.name for a in both.adapters] == ["sql", "legal"] and both.rollout == "surge"
    stronger = change(both, add=[msgspec.structs.replace(SQL, scale=2.0)], in_place=True)
    assert {a.name: a.scale for a in stronger.adapters} == {"legal": 0.5, "sql": 2.0}
    assert stronger.rollout == "in-place"
    assert change(stronger, remove=["legal", SQL.source]).adapters == []


def test_a_change_to_adapters_is_refused_saying_what_is_wrong():
    with pytest.raises(BadRequest, match="say what to change"):
        change(BASE)
    with pytest.raises(BadRequest, match=r"model 'm' has no adapter nope; its adapters: sql \(o/sql@"):
        change(change(BASE, add=[SQL]), remove=["nope"])
    with pytest.raises(BadRequest, match="adapter sql is added twice"):
        change(BASE, add=[SQL, SQL])
    many = [Adapter(name=f"a{i}", source=f"o/a/a{i}.gguf") for i in range(MOST_ADAPTERS + 1)]
    with pytest.raises(BadRequest, match=f"would have {MOST_ADAPTERS + 1} adapters; a model loads at most"):
        change(BASE, add=many)


def test_adapters_cannot_be_loaded_by_an_embedding_model_or_by_vllm_yet():
    with pytest.raises(BadRequest, match="is an embedding model: it takes no adapters"):
        check_model(msgspec.structs.replace(BASE, kind="embedding", adapters=[SQL]))
    mixed = msgspec.structs.replace(
        BASE, profiles=[Profile(name="cpu"), Profile(name="gpu", engine="vllm", gpus=1)], adapters=[SQL]
    )
    with pytest.raises(BadRequest, match="runs on vLLM, whose adapters llmgw does not serve yet"):
        check_model(mixed)


def test_the_set_of_adapters_restarts_replicas_and_a_new_scale_does_not():
    profile = BASE.profiles[0]
    before = fingerprint(BASE, profile)
    attached = change(BASE, add=[SQL])
    assert fingerprint(attached, profile) != before
    rescaled = change(attached, add=[msgspec.structs.replace(SQL, scale=3.0)])
    assert fingerprint(rescaled, profile) == fingerprint(attached, profile)
    assert fingerprint(change(attached, remove=["sql"]), profile) == before  # none: as it always was


def test_a_purge_deletes_the_adapters_no_other_model_loads():
    mine = change(BASE, add=[SQL, LEGAL])
    other = Model(name="other", source="o/x/x.gguf", adapters=[LEGAL])
    deleted, kept = files_to_purge(mine, {"other": other})
    assert deleted == [BASE.source, SQL.source]
    assert [(k.source, k.why) for k in kept] == [(LEGAL.source, "model other uses it")]


def test_an_adapter_is_named_for_its_file_unless_named():
    assert adapter_name("o/r@" + "a" * 40 + "/SQL v2.Q8_0.gguf") == "SQL-v2-Q8_0"
    assert adapter_name("o/peft-sql@" + "a" * 40 + "/adapter_model.safetensors") == "peft-sql"


def test_a_new_scale_keeps_the_adapters_place_so_no_replica_restarts():
    both = change(BASE, add=[SQL, LEGAL])
    rescaled = change(both, add=[msgspec.structs.replace(SQL, scale=0.25)])  # sql was first: it stays first
    assert [(a.name, a.scale) for a in rescaled.adapters] == [("sql", 0.25), ("legal", 0.5)]
    assert fingerprint(rescaled, BASE.profiles[0]) == fingerprint(both, BASE.profiles[0])
