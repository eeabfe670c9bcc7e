"""`llmgw plan FILE_OR_URL`: what a GGUF model needs and how fast each way of running it answers,
on this machine (no cluster needed) or, through `llmgw ctl model plan`, on the fleet."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import httpx
import msgspec

from llmgw.bus import meminfo_mb
from llmgw.gguf import GGUFError, Header, read_model
from llmgw.membw import load_calibration, measure
from llmgw.modelplan import (
    FileFacts,
    NodeFacts,
    Option,
    calibrated_rates,
    kv_per_1000_mb,
    options,
    shape_from_gguf,
    speed_note,
)
from llmgw.proto.errors import described

__all__ = ["Plan", "describe", "file_facts", "local_node", "make_plan", "plan_text", "run_plan"]


class Plan(msgspec.Struct, kw_only=True):
    """What `llmgw plan --json` prints."""

    files: list[Header]
    """Every file planned (the quantisations of one model)."""
    context: int
    kv_per_1000_tokens_mb: float
    nodes: list[NodeFacts]
    options: list[Option]
    best: Option | None


def file_facts(where: str) -> tuple[Header, FileFacts]:
    """The header of a local file or URL, and what the plan needs of it."""
    header = read_model(where)
    name = where.rstrip("/").rsplit("/", 1)[-1]
    return header, FileFacts(name=name, format="gguf", quant=header.file_type, shape=shape_from_gguf(header))


def local_node(home: Path, bandwidth: tuple[float, float] | None) -> NodeFacts:
    """This machine: its CPUs, memory, memory bandwidth (measured unless given) and calibration."""
    total, available = meminfo_mb(Path("/proc/meminfo").read_text())
    calibration = load_calibration(home)
    if bandwidth is None:
        measured = measure()
        bandwidth = (measured.all_cores_gbs, measured.one_core_gbs) if measured else (0.0, 0.0)
    elif calibration is not None:  # the rates given are the ones to read at
        calibration = msgspec.structs.replace(calibration, all_gbs=0.0, core_gbs=0.0)
    return NodeFacts(
        name=socket.gethostname().split(".")[0],
        cpus=os.cpu_count() or 1,
        memory_total_mb=total,
        memory_available_mb=available,
        membw_all_gbs=bandwidth[0],
        membw_one_gbs=bandwidth[1],
        calibration=calibration,
    )


def _gib(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.1f} MiB"


def _many(n: float, unit: str) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "G" if unit == "B" else "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.2f}{suffix}{unit if unit == 'B' else ''}"
    return f"{n / 1e3:.1f}k{unit if unit == 'B' else ''}"


def describe(h: Header) -> str:
    """One line of what the file is."""
    experts = f", {h.expert_used_count} of {h.expert_count} experts a token" if h.expert_count else ""
    parts = f", {h.split_count} parts" if h.split_count > 1 else ""
    return (
        f"{h.architecture} {h.file_type}, {_many(h.parameters, '')} parameters, {_many(h.tensor_bytes, 'B')} "
        f"(a token reads {_many(h.active_bytes, 'B')}{experts}), {h.block_count} layers, "
        f"{h.head_count_kv}/{h.head_count} KV heads, trained for {h.context_length} tokens{parts}"
        + (", an embedding model" if h.embedding else "")
    )


def _way(o: Option) -> str:
    if o.device == "cpu":
        return f"llama.cpp on the CPU, {o.threads} thread{'s' if o.threads != 1 else ''}"
    split = "tensor parallel" if o.tensor_parallel else "layers split"
    way = f"{o.engine} on {o.cards}x {o.device}" + (f" ({split})" if o.cards > 1 else "")
    if o.cpu_moe_layers:
        way += f", experts of {o.cpu_moe_layers} layers on the CPU ({_gib(o.host_mb)}, {o.threads} threads)"
    return way


def plan_text(plan: Plan) -> str:
    """The plan as a person reads it: the file, the ways (best first), the best one, the KV cost."""
    lines = [f"{h.where}: {describe(h)}" for h in plan.files]
    for n in plan.nodes:
        calibrated = (
            f"{n.calibration.source} (worst error {n.calibration.worst_error:.0%} over what it measured, "
            f"{n.calibration.holdout_error:.0%} on models left out of the fit)"
            if n.calibration
            else "default CPU constants (`llmgw plan calibrate` fits this node's)"
        )
        measured = (n.membw_all_gbs, n.membw_one_gbs)
        if n.calibration and (at := calibrated_rates(*measured, n.calibration)) != measured:
            calibrated += f"; estimates read at its {at[0]:g}/{at[1]:g} GB/s"
        lines.append(
            f"{n.name}: {n.cpus} CPUs, {_gib(n.memory_total_mb)} ({_gib(n.memory_available_mb)} available), "
            f"memory {n.membw_all_gbs:g} GB/s all cores, {n.membw_one_gbs:g} one core; {calibrated}"
        )
    lines.append("")
    if not plan.options:
        lines.append(f"No way to run it at context {plan.context}: no node has the memory.")
    else:
        several = len(plan.files) > 1
        rows = [(*(("FILE",) if several else ()), "WAY", "NEEDS", "HAS", "WHERE", "SPEED")]
        for o in plan.options:
            where = o.node + ("" if o.free_now else " (when room is free)")
            rows.append(
                (
                    *((o.file,) if several else ()),
                    _way(o),
                    _gib(o.need_mb) + ("/card" if o.cards else ""),
                    _gib(o.have_mb),
                    where,
                    speed_note(o.tokens_per_second),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.append("")
        which = f"{plan.best.file}, " if several else ""
        lines.append(f"Best: {which}{_way(plan.best)} on {plan.best.node}, {speed_note(plan.best.tokens_per_second)}.")
    lines.append(
        f"KV cache: {plan.kv_per_1000_tokens_mb:.1f} MiB per 1000 tokens of context (f16); "
        f"context {plan.context} takes {_gib(plan.kv_per_1000_tokens_mb * plan.context / 1000)}."
    )
    return "\n".join(lines)


def make_plan(
    wheres: list[str], nodes: list[NodeFacts], context: int | None, threads: int | None, slots: int = 1
) -> Plan:
    """The plan of a model's files over `nodes` (context: the model's own, at most 8192, unless given)."""
    read = [file_facts(where) for where in wheres]
    headers, facts = [h for h, _ in read], [f for _, f in read]
    context = context or min(headers[0].context_length or 4096, 8192)
    ways = options(facts, nodes, context, slots, threads)
    kv = kv_per_1000_mb(facts[0].shape, context, slots)
    return Plan(
        files=headers,
        context=context,
        kv_per_1000_tokens_mb=round(kv, 2),
        nodes=nodes,
        options=ways,
        best=ways[0] if ways else None,
    )


def run_plan(
    where: str,
    home: Path,
    context: int | None,
    threads: int | None,
    bandwidth: tuple[float, float] | None,
    as_json: bool,
) -> int:
    """`llmgw plan FILE_OR_URL` on this machine: 0 where a way fits, 1 where none does (the plan
    says so), or 2 with one line saying why not (a file that is not a GGUF model llmgw reads, a
    server that does not serve it)."""
    try:
        plan = make_plan([where], [local_node(home, bandwidth)], context, threads)
    except GGUFError as exc:
        return _refused(str(exc))
    except httpx.HTTPError as exc:
        return _refused(f"{where}: cannot fetch its header ({described(exc)})")
    if as_json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(plan)) + b"\n")
    else:
        print(plan_text(plan))
    return 0 if plan.options else 1


def _refused(sentence: str) -> int:
    print(f"llmgw plan: {' '.join(sentence.split())}", file=sys.stderr)
    return 2
