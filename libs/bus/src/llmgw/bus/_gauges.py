"""Prometheus series made when scraped, from what a service already keeps in memory: a
`ScrapeCollector` calls a function that yields them; `family` makes one from a dict of counts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from nats.aio.client import Client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ScrapeCollector", "family", "nats_series"]


def family(kind: type, name: str, doc: str, values: Mapping[tuple, float], labels: str) -> Metric:
    """A family of `kind` (CounterMetricFamily, GaugeMetricFamily) with a series per key of
    `values` (the label values, in the order `labels` names them)."""
    made = kind(name, doc, labels=labels.split())
    for key, value in list(values.items()):
        made.add_metric([str(v) for v in key], value)
    return made


class ScrapeCollector(Collector):
    """Series made at each scrape by `make` (on the loop the admin server runs on)."""

    def __init__(self, make: Callable[[], Iterable[Metric]]) -> None:
        self.make = make

    def collect(self) -> Iterator[Metric]:
        yield from self.make()


def nats_series(nc: Client) -> Callable[[], Iterator[Metric]]:
    """What a `ScrapeCollector` calls for whether the service is connected to NATS now."""

    def made() -> Iterator[Metric]:
        connected = float(nc.is_connected)
        yield GaugeMetricFamily("llmgw_nats_connected", "1 while this service is connected to NATS", value=connected)

    return made
