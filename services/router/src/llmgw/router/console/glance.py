"""The fleet at a glance, reckoned without I/O from what the services answered: the models'
replicas ready and wanted, the nodes' host and card memory, and the last hour's traffic in
five-minute buckets (requests, failures, tokens a second from the usage sums; time to the first
token, p50 and p95, from the request log's latest records)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from llmgw.proto import ModelStatus, NodeInfo, UsageRecord, UsageRow

__all__ = ["BUCKET_S", "Fleet", "Traffic", "fleet_of", "percentile", "traffic_of"]

BUCKET_S = 300
"""The traffic's buckets, seconds."""


class Fleet(NamedTuple):
    """Replicas and memory, summed over the fleet."""

    models: int
    running: int
    """Models with every wanted replica ready."""
    ready: int
    wanted: int
    nodes: int
    host_used_mb: int
    host_total_mb: int
    cards: int
    card_used_mb: int
    card_total_mb: int


class Traffic(NamedTuple):
    """The last hour, a row per bucket start (oldest first), and its totals."""

    starts: list[float]
    requests: list[int]
    errors: list[int]
    tokens_per_s: list[float]
    """Answer tokens a second over each bucket."""
    ttft_p50: list[float | None]
    ttft_p95: list[float | None]
    """Seconds, over the streamed requests of the bucket in the sample; None: none there."""
    total_requests: int
    total_errors: int
    ttft_all: tuple[float | None, float | None]
    """p50 and p95 over the whole sample."""
    sampled: int
    """Streamed requests the TTFT is reckoned from (the request log's latest, at most a few thousand)."""


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank `p`th percentile (0-100) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def fleet_of(statuses: Iterable[ModelStatus], nodes: Iterable[NodeInfo]) -> Fleet:
    """The fleet's replicas (ready, wanted) and memory (host: used of total; cards: used, others'
    included, of total)."""
    st, ns = list(statuses), list(nodes)
    cards = [g for n in ns for g in n.gpus]
    return Fleet(
        models=len(st),
        running=sum(s.wanted > 0 and s.ready >= s.wanted for s in st),
        ready=sum(s.ready for s in st),
        wanted=sum(s.wanted for s in st),
        nodes=len(ns),
        host_used_mb=sum(n.memory_total_mb - n.memory_available_mb for n in ns),
        host_total_mb=sum(n.memory_total_mb for n in ns),
        cards=len(cards),
        card_used_mb=sum(g.memory_used_mb + g.memory_foreign_mb for g in cards),
        card_total_mb=sum(g.memory_total_mb for g in cards),
    )


def traffic_of(rows: Iterable[UsageRow], records: Iterable[UsageRecord], first: float, last: float) -> Traffic:
    """Buckets from `first` to `last` (starts, `BUCKET_S` apart) of the usage `rows` (by any group,
    in buckets of `BUCKET_S`) and the TTFTs of `records` (a sample: the latest requests)."""
    starts = [float(s) for s in range(int(first), int(last) + 1, BUCKET_S)]
    at = {s: i for i, s in enumerate(starts)}
    requests, errors, answered = [0] * len(starts), [0] * len(starts), [0] * len(starts)
    for r in rows:
        if (i := at.get(r.start)) is not None:
            requests[i] += r.requests
            errors[i] += r.errors
            answered[i] += r.completion_tokens
    ttfts: list[list[float]] = [[] for _ in starts]
    every: list[float] = []
    for rec in records:
        if rec.ttft_s is None:
            continue
        every.append(rec.ttft_s)
        i = at.get(float(int(rec.time) // BUCKET_S * BUCKET_S))
        if i is not None:
            ttfts[i].append(rec.ttft_s)
    return Traffic(
        starts=starts,
        requests=requests,
        errors=errors,
        tokens_per_s=[n / BUCKET_S for n in answered],
        ttft_p50=[percentile(t, 50) for t in ttfts],
        ttft_p95=[percentile(t, 95) for t in ttfts],
        total_requests=sum(requests),
        total_errors=sum(errors),
        ttft_all=(percentile(every, 50), percentile(every, 95)),
        sampled=len(every),
    )
