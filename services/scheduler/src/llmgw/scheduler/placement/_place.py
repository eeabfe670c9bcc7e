"""Placing one replica: the nodes that pass every filter, scored, the best taken; across several
nodes, the group of nodes that scores best together."""

from __future__ import annotations

import msgspec
import numpy as np

from llmgw.proto import Model, ReplicaState, Worker
from llmgw.scheduler.placement._filters import cards_for
from llmgw.scheduler.placement._room import Need, NodeState, Placement
from llmgw.scheduler.placement._scan import Index, Reasons, scan
from llmgw.scheduler.placement._scorers import Parts, Weights, scores

__all__ = ["Index", "Reasons", "Search", "place"]


class Search(msgspec.Struct, frozen=True, kw_only=True):
    """How one placement looks over the fleet."""

    stale_s: float = 10.0
    """A node silent this long (suspect) takes nothing new."""
    weights: Weights = Weights()
    """How much each scorer counts."""
    peers: list[ReplicaState] | None = None
    """The model's live replicas, for the domain spread (None: found on the nodes)."""
    limit: int = 0
    """Stop the scan at this many nodes that fit (0: every node); a replica across nodes scores all."""
    start: int = 0
    """Begin the scan at this node (by position, wrapping), so successive placements look at others."""
    index: Index | None = None
    """The pass's index of the fleet (its free room in columns, the nodes each kind of need
    skips), where it keeps one."""


def place(
    need: Need, model: Model, nodes: dict[str, NodeState], now: float, how: Search = Search()
) -> tuple[Placement | None, Reasons]:
    """The best node for one replica (the best nodes, for a profile across several), or None;
    and why each refused node refused (filter: reason).

    With a `how.limit`, the scan stops at that many nodes that fit, starting at the
    `how.start`-th node and wrapping (Kubernetes' percentage of nodes to score): a big fleet is
    not scored whole for every replica, and successive placements look at different nodes.
    """
    if need.profile.nodes > 1:
        return _place_across(need, model, nodes, now, how)
    table, names, at, reasons = scan(need, nodes, now, how.stale_s, how.start, how.limit, how.index)
    if not len(at):
        return None, reasons
    total, parts = scores(need, model, nodes, table, at, how.weights, how.peers)
    tied = (total == np.maximum.reduce(total)).nonzero()[0].tolist()
    i = max(tied, key=lambda j: names[at[j]])  # the best total; of those tied, the last name
    best = names[at[i]]
    return Placement(node=best, cards=cards_for(need, nodes[best]), scores=parts.at(i)), reasons


def _place_across(
    need: Need, model: Model, nodes: dict[str, NodeState], now: float, how: Search
) -> tuple[Placement | None, Reasons]:
    """`need.profile.nodes` nodes that each fit a share, within one value of its `keep_within`
    label if it has one: in the group whose best nodes score highest together, those nodes. The
    engine runs on the best of them, workers on the rest. Every fitting node is scored."""
    count, label = need.profile.nodes, need.profile.keep_within
    found = scan(need, nodes, now, how.stale_s, 0, 0, how.index)
    fit, table, at, reasons = found.fit, found.table, found.at, found.reasons
    total, parts = scores(need, model, nodes, table, at, how.weights, how.peers) if fit else (np.zeros(0), Parts())
    score = dict(zip(fit, total.tolist(), strict=True))
    groups: dict[str, list[str]] = {}
    for name in fit:
        groups.setdefault(nodes[name].info.labels[label] if label else "", []).append(name)
    best: list[str] = []
    for members in groups.values():
        members.sort(key=lambda n: (-score[n], n))
        if len(members) >= count and (not best or sum(score[n] for n in members[:count]) > sum(score[n] for n in best)):
            best = members[:count]
    if not best:
        most = max(groups.items(), key=lambda kv: len(kv[1]), default=("", []))
        where = f" within one {label} (most in one: {len(most[1])}, {label}={most[0]})" if label and fit else ""
        reasons["together"] = f"nodes: needs {count} nodes that fit{where}; {len(fit)} fit"
        return None, reasons
    head = best[0]
    i = fit.index(head)
    workers = [
        Worker(node=n, memory_mb=need.memory_mb, cores=need.profile.cpu_cores or 0, gpus=cards_for(need, nodes[n]))
        for n in best[1:]
    ]
    return Placement(
        node=head,
        cards=cards_for(need, nodes[head]),
        workers=workers,
        scores=parts.at(i),
    ), reasons
