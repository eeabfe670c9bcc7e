"""The ways each file a Hub search found would run on the fleet, without I/O: the serve plan a
mirrored file gets, made from what the mirror read of its header by range requests."""

from __future__ import annotations

from llmgw.catalog.serve import serve_plan
from llmgw.modelplan import FileFacts, NodeFacts
from llmgw.proto.catalog import ServePlan, ServePlanAsk
from llmgw.proto.errors import BadRequest
from llmgw.proto.hub import HubFound

__all__ = ["hub_plans"]


def hub_plans(found: HubFound, nodes: list[NodeFacts]) -> dict[str, ServePlan]:
    """Each file of a Hub search whose header was read: every way it would run on `nodes` now
    (the serve plan a mirrored file gets, at its trained context up to 8192); none with no node."""
    plans: dict[str, ServePlan] = {}
    if not nodes:
        return plans
    for model in found.models:
        for f in model.files:
            if f.facts is None:
                continue
            facts = FileFacts(name=f.path.rsplit("/", 1)[-1], format="gguf", quant=f.facts.quant, shape=f.facts.shape)
            try:
                plans[f.source] = serve_plan(ServePlanAsk(source=f.source), facts, f.facts.trained_context, nodes)
            except BadRequest as exc:  # a shape no plan holds (no layers, say): no ways, said
                plans[f.source] = ServePlan(source=f.source, context=0, slots=1, warnings=[exc.message])
    return plans
