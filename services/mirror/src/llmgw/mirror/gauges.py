"""The mirror's fetches as Prometheus series, made from what it holds at each scrape: repos by
state, bytes held and still to fetch, fetches ended and bytes fetched since it started."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw.bus import family
from llmgw.mirror.fetches import Fetches

__all__ = ["mirror_series"]


def mirror_series(fetches: Fetches) -> Callable[[], Iterator[Metric]]:
    """What a `ScrapeCollector` calls for the mirror's series."""

    def made() -> Iterator[Metric]:
        repos = list(fetches.repos.values())
        states: dict[tuple, float] = {}
        for r in repos:
            states[(r.state,)] = states.get((r.state,), 0) + 1
        yield family(
            GaugeMetricFamily, "llmgw_mirror_repos", "Repos the mirror holds or fetches, by state", states, "state"
        )
        held = sum(r.size for r in repos if r.state == "ready")
        wanted = {("held",): held, ("pending",): fetches.pending_bytes()}
        yield family(
            GaugeMetricFamily, "llmgw_mirror_bytes", "Bytes the mirror holds, and those still to fetch", wanted, "kind"
        )
        ended = {(how,): n for how, n in fetches.fetched.items()}
        yield family(
            CounterMetricFamily, "llmgw_mirror_fetches", "Repo fetches ended since the mirror started", ended, "outcome"
        )
        got = CounterMetricFamily("llmgw_mirror_fetched_bytes", "Bytes of files fetched and verified since it started")
        got.add_metric([], fetches.fetched_bytes)
        yield got

    return made
