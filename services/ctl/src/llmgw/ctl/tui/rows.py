"""What the terminal console's tables show, from the operators' operations' answers, without
I/O: a node's line, a model's (`llmgw.ctl.tables.model_rows`), a Hub file's best way here, a key's,
and a model's tokens an hour as a chart's points."""

from __future__ import annotations

from typing import NamedTuple

from llmgw.ctl.hub_commands import best_way, size_text
from llmgw.ctl.tables import limits_text, memory_cell, model_rows, speed_cell
from llmgw.ctl.tui.words import Words
from llmgw.proto import KeyList, ModelList, ModelStatusList, NodeList, ReplicaList
from llmgw.proto.hub import HubWays
from llmgw.proto.mirror import RepoList
from llmgw.proto.router import UsageReport

__all__ = ["HubRow", "hub_rows", "key_rows", "model_table", "node_rows", "repo_rows", "usage_series"]


def _gb(mb: int) -> str:
    return f"{mb / 1024:.1f}"


def node_rows(listed: NodeList, replicas: ReplicaList, w: Words) -> list[tuple[str, ...]]:
    """Each node: state, cores, host memory (GiB free/all), its memory's read rate (all cores,
    one), the replicas on it, calibrated or not, its cards' memory (used, free, held by other
    programs): the widest last, so that 80 columns show the rest."""
    on: dict[str, list[str]] = {}
    for r in replicas.replicas:
        on.setdefault(r.node, []).append(f"{r.model}:{r.state}")
    rows = []
    for n in listed.nodes:
        health = listed.health.get(n.node)
        read = "/".join(f"{g:.0f}" if g else "?" for g in (n.membw_all_gbs, n.membw_one_gbs))
        cards = ", ".join(
            f"{g.cls or g.name} {_gb(g.memory_used_mb)}/{_gb(g.memory_total_mb - g.memory_used_mb)}/"
            f"{_gb(g.memory_foreign_mb)}"
            for g in n.gpus
        )
        rows.append(
            (
                n.node,
                health.state if health else "?",
                str(n.cpus),
                f"{_gb(n.memory_available_mb)}/{_gb(n.memory_total_mb)}",
                read,
                ", ".join(on.get(n.node, [])) or "-",
                w.t("yes") if n.cpu_calibration else w.t("no"),
                cards or "-",
            )
        )
    return rows


def model_table(listed: ModelList, replicas: ReplicaList, statuses: ModelStatusList | None) -> list[tuple[str, ...]]:
    """Each model: ready/wanted, state, profiles with counts, memory planned/used, ~tok/s, and why."""
    rows = []
    for r in model_rows(listed, replicas, statuses).models:
        counted = any(c is not None for c in r.profiles.values())
        profiles = ", ".join(f"{n}={c or 0}" if counted else n for n, c in r.profiles.items())
        memory, speed = memory_cell(r.estimate_mb, r.measured_mb), speed_cell(r.tokens_per_s)
        rows.append((r.name, f"{r.ready}/{r.wanted}", r.status, profiles, memory, speed, r.warning or "-"))
    return rows


class HubRow(NamedTuple):
    """One GGUF file the Hub search found, as its line says it."""

    source: str
    repo: str
    path: str
    size: str
    best: str
    slow: bool
    """Its best way here is marked slow or very slow (shown in the warning colour)."""


def hub_rows(ways: HubWays) -> list[HubRow]:
    """Each file found, with its size and type and the best way it runs here now."""
    rows = []
    for m in ways.found.models:
        for f in m.files:
            plan = ways.plans.get(f.source)
            size = f"{size_text(f.size)} {f.facts.quant}" if f.facts else "?"
            slow = bool(plan and plan.ways and plan.ways[0].mark)
            rows.append(HubRow(f.source, m.repo, f.path, size, best_way(f, plan, ways.nodes), slow))
    return rows


def repo_rows(listed: RepoList, w: Words) -> list[tuple[str, ...]]:
    """Each repo on the mirror at each commit: how its fetch is doing (state, bytes done of all,
    the rate and time left while it runs, why it failed)."""
    rows = []
    for r in listed.repos:
        rate = f"{r.rate / 1e6:.1f} MB/s" + (f", {r.eta_s:.0f} s left" if r.eta_s is not None else "") if r.rate else ""
        fetch = w.t("fetch.state", state=r.state, done=size_text(r.done), size=size_text(r.size), rate=rate)
        rows.append((r.repo, r.commit[:8] or "-", (r.error or fetch).strip()))
    return rows


def key_rows(keys: KeyList, used: dict[str, int]) -> list[tuple[str, ...]]:
    """Each key: id, name, its limits, and the tokens it used in the last 24 hours (`used`, by id)."""
    return [(kid, k.name, limits_text(k.limits), f"{used.get(kid, 0):,}") for kid, k in keys.keys.items()]


def usage_series(report: UsageReport, start: float, buckets: int, bucket_s: int) -> dict[str, list[float]]:
    """Each group's tokens in each of `buckets` buckets of `bucket_s` seconds from `start` (a
    report asked with that bucket size): a chart's points, oldest first."""
    series: dict[str, list[float]] = {}
    for row in report.rows:
        i = int((row.start - start) // bucket_s)
        if 0 <= i < buckets:
            series.setdefault(row.group, [0.0] * buckets)[i] += row.prompt_tokens + row.completion_tokens
    return series
