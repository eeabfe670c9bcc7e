"""The model a serve makes, without I/O: the chosen ways as profiles (a card profile 'gpu' above a
CPU profile 'cpu'), its name from its file, replicas per profile."""

from __future__ import annotations

import re

import msgspec

from llmgw.proto import Model, Profile, Scaling
from llmgw.proto.catalog import ServeModel, ServePlan, ServeWay
from llmgw.proto.errors import BadRequest

__all__ = ["default_name", "parse_replicas", "served_model"]

_PAIR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_-]*)\s*=\s*([0-9]+)\s*$")


def parse_replicas(replicas: dict[str, int] | str) -> dict[str, int]:
    """Replicas per profile from a map or 'gpu=7,cpu=4'; BadRequest for what does not read."""
    if isinstance(replicas, dict):
        return dict(replicas)
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in replicas.split(","))):
        m = _PAIR.match(part)
        if not m:
            raise BadRequest(f"replicas '{replicas}': '{part}' is not PROFILE=COUNT; write it as gpu=7,cpu=4")
        counts[m[1]] = int(m[2])
    return counts


def default_name(source: str) -> str:
    """A model name from its file: 'org/repo@c/SmolLM2-135M.Q4_1.gguf' -> 'smollm2-135m-q4_1'."""
    stem = source.rsplit("/", 1)[-1].removesuffix(".gguf").lower()
    name = re.sub(r"[^a-z0-9_-]+", "-", stem).strip("-_")[:63]
    return name or "model"


def _profiles(ask: ServeModel, card: ServeWay | None, cpu: ServeWay | None) -> list[Profile]:
    cores, slots, priority = ask.cores or None, ask.slots, 1 if cpu else 0
    gpu = card and Profile(
        name="gpu",
        gpus=card.cards,
        min_card_mb=card.memory_mb,
        slots=slots,
        priority=priority,
        cpu_moe_layers=card.experts_on_cpu,
        cpu_cores=cores if card.experts_on_cpu else None,
    )
    host = cpu and Profile(name="cpu", host_memory_mb=cpu.memory_mb, cpu_cores=cores, slots=slots, nodes=cpu.nodes)
    return [p for p in (gpu, host) if p]


def served_model(ask: ServeModel, plan: ServePlan, card: ServeWay | None, cpu: ServeWay | None) -> Model:
    """The catalog entry the chosen ways make: a card profile 'gpu' above a CPU profile 'cpu',
    replicas per profile when asked (the scaling their sum), else one replica."""
    name = ask.name or default_name(ask.source)
    profiles = _profiles(ask, card, cpu)
    counts = parse_replicas(ask.replicas)
    scaling = Scaling()
    if counts:
        known = [p.name for p in profiles]
        unknown = sorted(set(counts) - set(known))
        if unknown:
            raise BadRequest(
                f"replicas: no profile {', '.join(unknown)}; this serve makes {', '.join(known)}; "
                f"write {','.join(f'{k}=1' for k in known)} (--cpu and --gpus N make both)"
            )
        total = sum(counts.values())
        if total == 0:
            raise BadRequest(f"replicas: every count is zero; write at least one, as {known[0]}=1")
        profiles = [msgspec.structs.replace(p, replicas=counts.get(p.name, 0)) for p in profiles]
        scaling = Scaling(min=total, max=total)
    return Model(
        name=name, source=ask.source, context=plan.context, profiles=profiles, scaling=scaling, judge=ask.judge
    )
