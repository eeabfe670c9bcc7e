"""Serving a mirrored file, without I/O: every way it runs on the fleet's nodes (the serve plan),
and the rule that makes the CPU a choice made on purpose (the model a chosen way becomes: served.py).

The rule: a way on the CPU that would answer under 5 tokens a second is refused unless the
request says `cpu_anyway`, cards free or not; the CPU alone while cards that fit are free is
refused without it too, naming them; a slow way (under 15) is taken with a warning.
"""

from __future__ import annotations

import msgspec

from llmgw.modelplan import (
    DEFAULT_CPU,
    JUDGE_BOUND_S,
    SLOW_TPS,
    VERY_SLOW_TPS,
    FileFacts,
    NodeFacts,
    Option,
    active_type_bytes,
    card_of,
    cpu_threads,
    cpu_tokens_per_second,
    llamacpp_memory,
    options,
    prefill_tokens_per_second,
    verdict_seconds,
)
from llmgw.proto.catalog import LEAST_CONTEXT, Model, ServeModel, ServePlan, ServePlanAsk, ServeWay
from llmgw.proto.errors import BadRequest

__all__ = [
    "MOST_DEFAULT_CONTEXT",
    "check_context",
    "check_serve",
    "choose_ways",
    "fit_to_cards",
    "largest_context",
    "plan_for_cards",
    "reply_words",
    "serve_plan",
    "takes_cpu_anyway",
]

MOST_DEFAULT_CONTEXT = 8192
"""The context a plan sizes for when none is asked: the model's trained context, at most this."""
_UNKNOWN_CONTEXT = 4096
"""And when the file does not say what it was trained for."""
_RPC_HOP_S = 0.002
"""Seconds a token loses at each node past the first of a way across nodes, its activations
passed on over llama.cpp's RPC: assumed (a round trip on a LAN), not measured here."""
_WAYS_OUT = "serve it on a card (--gpus 1; gpus in the API), or say the CPU is on purpose (--cpu-anyway; cpu_anyway)"


def reply_words(seconds: float) -> str:
    """How long a reply takes, as a person says it: 'about 40 seconds', 'about 3 minutes'."""
    if seconds < 90:
        return f"about {max(round(seconds), 1)} seconds"
    return f"about {round(seconds / 60)} minutes"


def _mark(tps: float) -> str:
    if 0 < tps < VERY_SLOW_TPS:
        return "very slow"
    if 0 < tps < SLOW_TPS:
        return "slow"
    return ""


def _mib(n: int) -> int:
    return -(-n // 2**20)


def _kind(o: Option) -> str:
    if o.device == "cpu":
        return "cpu"
    return "gpu" if o.cards == 1 else "multi-gpu"


def _room(o: Option, node: NodeFacts) -> int:
    """Replicas of way `o` that fit on `node` now."""
    if o.device == "cpu":
        return node.memory_available_mb // max(o.need_mb, 1)
    free = sum(g.free for g in node.cards if g.cls == o.device) // max(o.cards, 1)
    return min(free, node.memory_available_mb // o.host_mb) if o.host_mb else free


def _way(facts: FileFacts, context: int, slots: int, seen: list[tuple[Option, NodeFacts]]) -> ServeWay:
    """One way from what each node made of it: reckoned on the fastest node where it fits now
    (else the fastest), fitting now on those with room."""
    best, node = max(seen, key=lambda s: (s[0].free_now, s[0].tokens_per_second))
    fit = [(o, n) for o, n in seen if o.free_now]
    memory = llamacpp_memory(facts.shape, context, slots, cards=best.cards, cpu_moe=best.cpu_moe_layers)
    tps = best.tokens_per_second
    card = card_of(best.device) if best.device != "cpu" else None
    prefill = prefill_tokens_per_second(facts.shape.parameters, best.threads, card, max(best.cards, 1))
    return ServeWay(
        kind=_kind(best),
        cards=best.cards,
        card_class="" if best.device == "cpu" else best.device,
        threads=best.threads,
        memory_mb=memory.mib,
        weights_mb=_mib(memory.weights),
        kv_mb=_mib(memory.kv),
        buffers_mb=_mib(memory.compute + memory.margin),
        experts_on_cpu=best.cpu_moe_layers,
        host_mb=best.host_mb,
        node=node.name,
        nodes_fit=sorted(n.name for _, n in fit),
        more_replicas=sum(_room(o, n) for o, n in fit),
        tokens_per_s=tps,
        mark=_mark(tps),
        reply_500_s=round(500 / tps, 1) if tps > 0 else 0.0,
        calibrated=best.device == "cpu" and node.calibration is not None,
        prefill_tokens_per_s=round(prefill, 1),
        verdict_s=round(verdict_seconds(prefill, tps), 2),
    )


def _share_seconds(facts: FileFacts, node: NodeFacts, k: int, threads: int) -> float:
    """Seconds a token takes on `node` for its 1/k share of the layers; 0: unknown."""
    share = {t: n // k for t, n in active_type_bytes(facts.shape).items()}
    calibration = node.calibration or DEFAULT_CPU
    read, layers = facts.shape.active_bytes // k, -(-facts.shape.layers // k)
    tps = cpu_tokens_per_second(read, node.membw_all_gbs, node.membw_one_gbs, threads, calibration, share, layers)
    return 1 / tps if tps > 0 else 0.0


def _across_nodes(facts: FileFacts, context: int, slots: int, cores: int, nodes: list[NodeFacts]) -> ServeWay | None:
    """The CPUs of the fewest nodes (2 to 8) that each hold a share (the scheduler's estimate), its layers run
    one node after another: on the slowest of those that fit now (else that hold a share), a hop between each."""
    able = [n for n in nodes if "llamacpp" in n.engines] if facts.format == "gguf" else []
    for k in range(2, 9):
        memory = llamacpp_memory(facts.shape, context, slots, cards=k)
        holds = [n for n in able if n.memory_total_mb >= memory.mib]
        if len(holds) >= k:
            break
    else:
        return None
    fit = [n for n in holds if n.memory_available_mb >= memory.mib]
    threads = {n.name: cpu_threads(cores or None, n.cpus) for n in holds}
    timed = [(_share_seconds(facts, n, k, threads[n.name]), n) for n in (fit if len(fit) >= k else holds)]
    chosen = sorted(timed, key=lambda s: (s[0] > 0, -s[0]))[:k]  # the unknown, then the slowest
    tps = 1 / (sum(s for s, _ in chosen) + (k - 1) * _RPC_HOP_S) if all(s > 0 for s, _ in chosen) else 0.0
    return ServeWay(
        kind="across-nodes",
        nodes=k,
        threads=min(threads[n.name] for _, n in chosen),
        memory_mb=memory.mib,
        weights_mb=_mib(memory.weights),
        kv_mb=_mib(memory.kv),
        buffers_mb=_mib(memory.compute + memory.margin),
        node=chosen[0][1].name,
        nodes_fit=sorted(n.name for n in fit),
        more_replicas=len(fit) // k,
        tokens_per_s=round(tps, 2),
        mark=_mark(tps),
        reply_500_s=round(500 / tps, 1) if tps > 0 else 0.0,
        calibrated=all(n.calibration is not None for _, n in chosen),
    )


def largest_context(facts: FileFacts, nodes: list[NodeFacts], slots: int) -> int:
    """The longest context (a multiple of 256) one replica on the CPU of the largest node holds; 0: none."""
    most = max((n.memory_total_mb for n in nodes), default=0)
    low, high = 0, 1 << 21
    while high - low > 256:
        mid = (low + high) // 2 // 256 * 256
        if llamacpp_memory(facts.shape, max(mid, 256), slots).mib <= most:
            low = mid
        else:
            high = mid
    return low


def _context(ask: ServePlanAsk, trained: int) -> int:
    return ask.context or min(trained or _UNKNOWN_CONTEXT, MOST_DEFAULT_CONTEXT)


def _check_ask(ask: ServePlanAsk, nodes: list[NodeFacts]) -> None:
    if not nodes:
        raise BadRequest(
            "no node has registered with the scheduler: start an agent (`llmgw service agent`), then ask again"
        )
    if 0 < ask.context < LEAST_CONTEXT:
        raise BadRequest(
            f"context {ask.context} is below the {LEAST_CONTEXT} tokens a model in the catalog takes at least; "
            f"write --context {LEAST_CONTEXT} or more (0: the model's trained context, at most 8192)"
        )
    most = max(n.cpus for n in nodes)
    if ask.cores > most:
        raise BadRequest(
            f"cores {ask.cores} is above every node's: the most any node has is {most}; "
            f"write --cores {most} or fewer (0: half a node's)"
        )


def serve_plan(ask: ServePlanAsk, facts: FileFacts, trained: int, nodes: list[NodeFacts]) -> ServePlan:
    """Every way file `facts` (trained for `trained` tokens, 0: unknown) runs on `nodes`, best first:
    fits now, then fastest, then fewest cards. Raises BadRequest for cores no node has, and for a
    context past the training that no node's memory holds."""
    _check_ask(ask, nodes)
    context = _context(ask, trained)
    seen: dict[tuple[str, int], list[tuple[Option, NodeFacts]]] = {}
    for node in nodes:
        for o in options([facts], [node], context, ask.slots, ask.cores or None):
            if o.engine == "llamacpp":
                seen.setdefault((o.device, o.cards), []).append((o, node))
    ways = [_way(facts, context, ask.slots, s) for s in seen.values()]
    across = None if ("cpu", 0) in seen else _across_nodes(facts, context, ask.slots, ask.cores, nodes)
    ways += [across] if across else []
    ways.sort(key=lambda w: (not w.nodes_fit, -w.tokens_per_s, w.cards))
    ways = [msgspec.structs.replace(w, on_purpose=takes_cpu_anyway(w, ways)) for w in ways]
    warnings = _judge_order(ways) if ask.judge else []
    if trained and context > trained:
        if not ways:
            raise BadRequest(
                f"context {context} is above the {trained} tokens the model was trained for, and no node has the "
                f"memory for it; write --context {min(trained, largest_context(facts, nodes, ask.slots))} or less"
            )
        warnings.append(
            f"context {context} is above the {trained} tokens the model was trained for: answers past "
            f"{trained} tokens may be poor; --context {trained} keeps to its training"
        )
    if not ways:
        fits = largest_context(facts, nodes, ask.slots)
        hint = f"write --context {fits} or less" if fits else "no node holds even its weights; add a larger node"
        warnings.append(f"no node has the memory for it at context {context}: {hint}")
    return ServePlan(
        source=ask.source, context=context, trained_context=trained, slots=ask.slots, ways=ways, warnings=warnings
    )


def _judge_order(ways: list[ServeWay]) -> list[str]:
    """A judge's ways in place, best first: fits now, then within `JUDGE_BOUND_S` a verdict, then
    fewest cards, then soonest; a warning where none that fits now is within the bound."""

    def soon(w: ServeWay) -> float:
        return w.verdict_s if w.verdict_s > 0 else float("inf")

    ways.sort(key=lambda w: (not w.nodes_fit, soon(w) > JUDGE_BOUND_S, w.cards, soon(w)))
    if not any(w.nodes_fit and 0 < w.verdict_s <= JUDGE_BOUND_S for w in ways):
        best = min((soon(w) for w in ways if w.nodes_fit), default=float("inf"))
        said = f"the soonest that fits now takes {best:.1f} s" if best < float("inf") else "none fits now"
        return [f"no way gives a verdict within {JUDGE_BOUND_S:g} s ({said}): every request it checks waits for it"]
    return []


def check_context(model: Model, facts: FileFacts, trained: int, nodes: list[NodeFacts]) -> list[str]:
    """A model's context held to the rule a serve plan holds --context to (one rule for every
    verb): refused where the plan has no way at it, saying what the plan says; else the plan's
    warnings (a context past the training, say). Sized for its profile of fewest slots; with no
    node registered, taken."""
    if not nodes:  # nothing to hold it against yet: the scheduler parks it until a node fits
        return []
    slots = min((p.slots for p in model.profiles), default=1)
    ask = ServePlanAsk(source=model.source, context=model.context, slots=slots)
    try:
        plan = serve_plan(ask, facts, trained, nodes)
    except BadRequest as exc:
        raise BadRequest(f"model '{model.name}': {exc.message}") from None
    if not plan.ways:
        said = "; ".join(plan.warnings) or f"no node holds it at context {model.context}"
        raise BadRequest(f"model '{model.name}': {said}")
    return plan.warnings


def fit_to_cards(ask: ServePlanAsk, facts: FileFacts, trained: int, nodes: list[NodeFacts], gpus: int) -> int:
    """The longest context (a multiple of 256, at most the plan's) at which `gpus` cards of some
    node hold one replica: weights, the KV cache of that context in the ask's slots, buffers (the
    pool fitted to the card); 0 where even 256 tokens do not fit."""

    def holds(context: int) -> bool:
        try:
            plan = serve_plan(msgspec.structs.replace(ask, context=context), facts, trained, nodes)
        except BadRequest:  # past the training, and no memory for it
            return False
        return any(w.cards == gpus for w in plan.ways)

    low, high = 0, _context(ask, trained) // 256 * 256 + 256
    while high - low > 256:
        mid = (low + high) // 2 // 256 * 256
        if holds(max(mid, 256)):
            low = max(mid, 256)
        else:
            high = mid
    return low


def plan_for_cards(ask: ServePlanAsk, facts: FileFacts, trained: int, nodes: list[NodeFacts], gpus: int) -> ServePlan:
    """The serve plan of `ask`, its context fitted to the cards when `gpus` cards hold the weights
    but not the KV cache of the default context (a warning says so); an explicit `--context`
    that does not fit is refused with the one that would."""
    plan = serve_plan(ask, facts, trained, nodes)
    if not gpus or any(w.cards == gpus for w in plan.ways):
        return plan
    fitted = fit_to_cards(ask, facts, trained, nodes, gpus)
    if not fitted:
        return plan  # not even the weights: choose_ways says what to do
    if ask.context:
        raise BadRequest(
            f"--gpus {gpus}: at context {plan.context} the KV cache does not fit {gpus} card(s) of any node; "
            f"at most {fitted} does: write --context {fitted}, or serve it on the CPU (--cpu)"
        )
    fitted_plan = serve_plan(msgspec.structs.replace(ask, context=fitted), facts, trained, nodes)
    fitted_plan.warnings.append(
        f"context fitted to the card: {fitted} tokens in {ask.slots} slot(s) ({plan.context} would not fit "
        f"{gpus} card(s) beside the weights); --context {fitted} or less keeps it there"
    )
    return fitted_plan


def _free_cards(ways: list[ServeWay]) -> str:
    """The free cards that fit, as '<class> on <nodes>'; empty when none."""
    named: dict[str, set[str]] = {}
    for w in ways:
        if w.cards and w.nodes_fit:
            named.setdefault(w.card_class, set()).update(w.nodes_fit)
    return "; ".join(f"{cls} on {', '.join(sorted(nodes))}" for cls, nodes in sorted(named.items()))


def _on_cpu(way: ServeWay) -> bool:
    return way.kind in ("cpu", "across-nodes") and not way.cards


def takes_cpu_anyway(way: ServeWay, ways: list[ServeWay]) -> bool:
    """Whether serving by `way` alone is a choice to make on purpose (check_serve's rule): a CPU way
    very slow, or the CPU while cards that fit are free."""
    return _on_cpu(way) and (_mark(way.tokens_per_s) == "very slow" or bool(_free_cards(ways)))


def check_serve(way: ServeWay, plan: ServePlan, cpu_anyway: bool, alone: bool = True) -> list[str]:
    """The warnings serving by `way` is taken with; BadRequest where it is a choice to make on
    purpose and `cpu_anyway` does not say so: a CPU way under 5 tokens a second (cards free or
    not), or the CPU `alone` (no card profile beside it) while cards that fit are free."""
    tps = way.tokens_per_s
    mark, minutes = _mark(tps), reply_words(500 / tps if tps > 0 else 0)
    on_cpu = _on_cpu(way)
    if on_cpu and mark == "very slow" and not cpu_anyway:
        raise BadRequest(
            f"{plan.source} would answer at about {tps:.1f} tokens a second on the CPU, "
            f"{f'across {way.nodes} nodes' if way.nodes > 1 else f'at best on {way.node}'}: "
            f"a reply of 500 tokens in {minutes}. To serve it, {_WAYS_OUT}"
        )
    free = _free_cards(plan.ways) if on_cpu and alone else ""
    if free and not cpu_anyway:
        card = next(w for w in plan.ways if w.cards and w.nodes_fit)
        raise BadRequest(
            f"{plan.source} on the CPU while cards that fit it are free ({free}): on one it answers at about "
            f"{card.tokens_per_s:.0f} tokens a second, against {tps:.1f} on the CPU. To serve it, {_WAYS_OUT}"
        )
    warnings = []
    if free:
        warnings.append(f"on the CPU on purpose while cards that fit it are free ({free})")
    where = f"on the CPU of {way.node}" if on_cpu else f"on {way.cards}x {way.card_class} of {way.node}"
    if way.experts_on_cpu:
        where += f", the experts of {way.experts_on_cpu} layers on its CPU"
    where = f"on the CPUs of {way.nodes} nodes" if way.nodes > 1 else where
    if mark == "very slow":
        warnings.append(
            f"Very slow: about {tps:.1f} tokens a second {where}: a reply of 500 tokens takes {minutes}"
            + (" (the CPU chosen on purpose)" if on_cpu else "")
        )
    elif mark == "slow":
        warnings.append(f"Slow: about {tps:.0f} tokens a second {where}: a reply of 500 tokens takes {minutes}")
    elif tps <= 0:
        warnings.append(f"speed unknown {where}: its agent has not measured the memory's rate yet")
    return warnings


def choose_ways(plan: ServePlan, ask: ServeModel, fleet_cards: int) -> tuple[ServeWay | None, ServeWay | None]:
    """The card way and the CPU way `ask` chooses of `plan` (the best way when it names neither) on
    a fleet of `fleet_cards` cards; BadRequest where it has no such way, saying what to write instead."""
    card_ways = [w for w in plan.ways if w.cards]
    cpu_way = next((w for w in plan.ways if not w.cards), None)
    if not ask.cpu and not ask.gpus:
        if not plan.ways:
            raise BadRequest(f"{plan.source}: no way to run it on this fleet; {' '.join(plan.warnings)}")
        best = plan.ways[0]
        return (best, None) if best.cards else (None, best)
    card = None
    if ask.gpus:
        if not fleet_cards:
            raise BadRequest(f"--gpus {ask.gpus}: no node of this fleet has a card; serve it on the CPU (--cpu)")
        if not card_ways:
            raise BadRequest(
                f"--gpus {ask.gpus}: no card of this fleet holds it at context {plan.context}; "
                "serve it on the CPU (--cpu), or with a shorter --context"
            )
        card = next((w for w in card_ways if w.cards == ask.gpus), None)
        if card is None:
            counts = ", ".join(str(c) for c in sorted({w.cards for w in card_ways}))
            raise BadRequest(f"--gpus {ask.gpus}: no node has that many cards that hold it; write --gpus {counts}")
    if ask.cpu and cpu_way is None:
        raise BadRequest(
            f"--cpu: no node has the memory for it at context {plan.context}; {' '.join(plan.warnings) or 'use cards'}"
        )
    return card, cpu_way if ask.cpu else None
