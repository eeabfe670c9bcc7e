"""The change each `llmgw ctl model VERB` asks for, made from its parsed words and checked like
any message before it is sent; without I/O."""

from __future__ import annotations

import argparse

import msgspec

from llmgw.proto import ModelChange, Scaling
from llmgw.proto.catalog import (
    RestartModel,
    ScaleModel,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
)

__all__ = ["BY", "change_of", "pairs"]

BY = "ctl"
"""Who the catalog records as having made a change from the command line."""


def pairs(items: list[str]) -> dict[str, int]:
    """PROFILE=COUNT words as a mapping; ValueError naming the first that is not one."""
    out = {}
    for item in items:
        profile, eq, count = item.partition("=")
        if not eq or not count.isdigit():
            raise ValueError(f"'{item}' is not PROFILE=COUNT (for example gpu=7 cpu=4)")
        out[profile] = int(count)
    return out


def _replicas(a: argparse.Namespace) -> SetReplicas:
    memory_mb = int(a.cpu_memory * 1024) if a.cpu_memory is not None else None
    return SetReplicas(name=a.name, by=BY, counts=pairs(a.counts), cpu_memory_mb=memory_mb, cpu_cores=a.cpu_cores)


def _context(a: argparse.Namespace) -> SetContext:
    if a.context is None and a.max_output is None:
        raise ValueError("say what to change: a context, --max-output, or both (llmgw ctl model context NAME 8192)")
    return SetContext(name=a.name, by=BY, context=a.context, max_output=a.max_output, in_place=a.in_place)


def _resources(a: argparse.Namespace) -> SetResources:
    if a.memory is None and a.cores is None:
        raise ValueError(
            "say what to change: --memory GIB, --cores N, or both (llmgw ctl model resources qwen cpu --memory 16)"
        )
    memory_mb = int(a.memory * 1024) if a.memory is not None else None
    return SetResources(name=a.name, by=BY, profile=a.profile, memory_mb=memory_mb, cores=a.cores, in_place=a.in_place)


def _aliases(a: argparse.Namespace) -> SetAliases:
    if not (a.add or a.drop):
        raise ValueError("say what to change: --add ALIAS or --drop ALIAS (each may be given again)")
    return SetAliases(name=a.name, by=BY, add_aliases=a.add or [], remove_aliases=a.drop or [])


_BUILD = {
    "stop": lambda a: StopModel(name=a.name, by=BY),
    "start": lambda a: StartModel(name=a.name, by=BY),
    "restart": lambda a: RestartModel(name=a.name, by=BY, in_place=a.in_place),
    "scale": lambda a: ScaleModel(
        name=a.name, by=BY, scaling=Scaling(min=a.min, max=a.min if a.max is None else a.max)
    ),
    "replicas": _replicas,
    "context": _context,
    "gpus": lambda a: SetGpus(name=a.name, by=BY, gpus=pairs(a.counts), in_place=a.in_place),
    "resources": _resources,
    "class": lambda a: SetClass(name=a.name, by=BY, capacity_class=a.capacity_class),
    "owner": lambda a: SetOwner(name=a.name, by=BY, owner=a.owner),
    "alias": _aliases,
}


def change_of(args: argparse.Namespace) -> ModelChange:
    """The change `llmgw ctl model VERB NAME ...` asks for, validated as the catalog will (a
    ValueError or msgspec.ValidationError says what is wrong)."""
    change = msgspec.structs.replace(_BUILD[args.verb](args), revision=getattr(args, "revision", None))
    return msgspec.convert(msgspec.to_builtins(change), type(change))
