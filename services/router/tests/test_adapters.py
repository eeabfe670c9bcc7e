"""Requests for a model's adapter (`MODEL:ADAPTER`), without I/O: which names a client may ask
for, the 404 for one not attached, and the body each engine gets."""

from llmgw.proto import Adapter, CatalogRecord, Model, ReplicaState
from llmgw.router.request.adapters import adapter_of, engine_body, no_such_adapter
from llmgw.router.routing.directory import names_of

MODEL = Model(
    name="m",
    source="o/m/m.gguf",
    aliases=["mm"],
    adapters=[Adapter(name="sql", source="o/a/sql.gguf", scale=0.5), Adapter(name="legal", source="o/a/l.gguf")],
)
BODY = {"model": "m:legal", "messages": [{"role": "user", "content": "hi"}]}


def replica(*adapters: str) -> ReplicaState:
    return ReplicaState(id="r", model="m", profile="cpu", node="n", adapters=list(adapters))


def test_a_model_is_asked_for_with_each_of_its_adapters():
    names = names_of({"m": CatalogRecord(model=MODEL)})
    assert names == {"m": "m", "m:sql": "m", "m:legal": "m", "mm": "m"}
    assert (adapter_of("m:sql"), adapter_of("m")) == ("sql", "")


def test_an_adapter_not_attached_is_a_404_naming_those_that_are():
    missing = no_such_adapter("m:nope", MODEL)
    assert (
        missing.status == 404 and missing.message == "The model 'm' has no adapter 'nope'; it has 'm:sql', 'm:legal'."
    )
    bare = no_such_adapter("x:y", Model(name="x", source="o/x/x.gguf"))
    assert "it has none (`llmgw ctl model adapters x add` attaches one)" in bare.message


def test_llama_server_is_told_every_adapters_scale_by_the_replicas_order():
    body = engine_body(BODY, MODEL, "legal", replica("sql", "legal"))
    assert body["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    plain = engine_body({**BODY, "model": "m"}, MODEL, "", replica("sql", "legal"))
    assert plain["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]  # none applies: said so explicitly
    assert BODY.get("lora") is None  # the request's own body is left as it was


def test_a_clients_own_lora_field_never_reaches_an_engine():
    sneaky = {**BODY, "model": "m", "lora": [{"id": 0, "scale": 4.0}]}
    assert "lora" not in engine_body(sneaky, MODEL, "", replica())
    assert engine_body(sneaky, MODEL, "", replica("sql"))["lora"] == [{"id": 0, "scale": 0.0}]
