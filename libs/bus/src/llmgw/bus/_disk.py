"""A service's own data directory's disk, on its admin port: its size and free bytes in
/metrics, and a line in /readyz once it is nearly full (llmgw.proto.node.disk_nearly_full), said
before it is full: NATS stops storing on a full disk, and a router's usage waits in its spool."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.proto.node import disk_nearly_full

__all__ = ["DiskCollector", "disk_note"]


def _usage(path: Path) -> tuple[int, int] | None:
    """(size, free) in bytes of the filesystem holding `path` (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.total, usage.free


def disk_note(path: Path) -> str:
    """'' while the disk under `path` has room; else one sentence saying how little is left."""
    usage = _usage(path)
    if usage is None or not disk_nearly_full(usage[0] / 2**20, usage[1] / 2**20):
        return ""
    total, free = usage
    return (
        f"disk nearly full: {path} has {free / 2**20:,.0f} MB free of {total / 2**20:,.0f} MB "
        f"({100 * free / max(total, 1):.1f}%); free some before it fills"
    )


class DiskCollector(Collector):
    """`llmgw_disk_size_bytes` and `llmgw_disk_free_bytes` of the data directory, read at each scrape."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage = _usage(self.path)
        size = GaugeMetricFamily("llmgw_disk_size_bytes", "Size of the data directory's disk", labels=["path"])
        free = GaugeMetricFamily("llmgw_disk_free_bytes", "Free bytes on the data directory's disk", labels=["path"])
        if usage is not None:
            size.add_metric([os.fspath(self.path)], usage[0])
            free.add_metric([os.fspath(self.path)], usage[1])
        yield size
        yield free
