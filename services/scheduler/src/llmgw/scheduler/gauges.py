"""The fleet as Prometheus gauges, made from the leading scheduler's book and inventory at each
scrape: replicas ready, wanted and failed per model, whether each node is heard, each replica's
engine memory (measured by its agent) and tokens a second (as placed), each node's host and card
memory. A standby says nothing (its book is the leader's, read late): one series per fleet."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgw.bus import family
from llmgw.scheduler.book import Book
from llmgw.scheduler.core import NodeView

__all__ = ["fleet_series"]

_MIB = 1 << 20


def fleet_series(
    book: Book,
    nodes: dict[str, NodeView],
    leading: Callable[[], bool],
    node_states: Callable[[], dict[str, str]] = dict,
) -> Callable[[], Iterator[Metric]]:
    """What a `ScrapeCollector` calls for the fleet's gauges (`node_states`: each node's state now)."""

    def made() -> Iterator[Metric]:
        if not leading():
            return
        counts: dict[tuple, float] = {}
        replicas = list(book.replicas.values())
        for st in list(book.statuses.values()):
            counts[st.model, "ready"], counts[st.model, "wanted"] = st.ready, st.wanted
            counts[st.model, "failed"] = 0
        for r in replicas:
            if r.state == "failed":
                counts[r.model, "failed"] = counts.get((r.model, "failed"), 0) + 1
        yield family(
            GaugeMetricFamily,
            "llmgw_model_replicas",
            "Replicas of a model: ready, wanted, and failed (their engines died or would not start)",
            counts,
            "model state",
        )
        states = node_states()
        yield family(
            GaugeMetricFamily,
            "llmgw_node_up",
            "1 while the scheduler hears a node (ready), 0 once it is suspect or lost; by its state",
            {(node, state): float(state == "ready") for node, state in states.items()},
            "node state",
        )
        memory = {(r.model, r.id, r.node): r.measured_mb * _MIB for r in replicas if r.measured_mb}
        yield family(
            GaugeMetricFamily,
            "llmgw_replica_memory_bytes",
            "Memory a replica's engine uses (host RSS plus its cards'), as its agent measured it",
            memory,
            "model replica node",
        )
        speed = {(r.model, r.id, r.node): r.tokens_per_s for r in replicas if r.tokens_per_s}
        yield family(
            GaugeMetricFamily,
            "llmgw_replica_tokens_per_second",
            "Tokens a second one reply gets from a replica, as reckoned when it was placed",
            speed,
            "model replica node",
        )
        views = list(nodes.values())
        host = {
            (v.info.node, kind): mb * _MIB
            for v in views
            for kind, mb in (("total", v.info.memory_total_mb), ("available", v.info.memory_available_mb))
        }
        yield family(GaugeMetricFamily, "llmgw_node_memory_bytes", "A node's host memory", host, "node kind")
        cards = {
            (v.info.node, g.uuid, kind): mb * _MIB
            for v in views
            for g in v.info.gpus
            for kind, mb in (("total", g.memory_total_mb), ("used", g.memory_used_mb), ("foreign", g.memory_foreign_mb))
        }
        yield family(
            GaugeMetricFamily,
            "llmgw_card_memory_bytes",
            "A card's memory (foreign: held by other programs)",
            cards,
            "node card kind",
        )

    return made
