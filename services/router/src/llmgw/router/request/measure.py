"""A prompt measured where its request needs it: for the context check of the model asked for,
and for replicas whose caches are known in tokens (`prepare.measure_plan` says when and whose),
the tokens an engine makes of it (`routing.oracle`)."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.router.request.core import Prepared, check_context, tokenize_request
from llmgw.router.request.prepare import measure_plan
from llmgw.router.routing.oracle import PrefixOracle

__all__ = ["measure"]


async def measure(
    oracle: PrefixOracle,
    prepared: Prepared,
    model: Model,
    ready: Iterable[tuple[ReplicaState, Profile]],
    primary: bool,
) -> list[int] | None:
    """The prompt's tokens where `model`'s ready replicas need them, and for the asked-for model
    (`primary`) a 400 where they and the answer asked for do not fit its context. None: not
    needed, or not to be had now (the engine checks then)."""
    plan = measure_plan(prepared, model, ready, primary)
    if plan is None:
        return None
    asked = tokenize_request(prepared.path, prepared.body, model.name)
    if asked is None or isinstance(asked, list):  # nothing to tokenize, or tokens already
        tokens = asked
    else:
        tokens = await oracle.tokens(asked, plan.replica, plan.profile)
    if tokens is not None and plan.check:
        check_context(len(tokens), prepared.max_tokens, plan.limit, model.name, prepared.path)
    return tokens
