"""Choose a buffer that defeats the caches, read it, keep the best pass."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from llmgw.membw._kernel import Buffer, max_threads

__all__ = ["Bandwidth", "buffer_size", "last_level_cache_bytes", "measure"]

_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


class Bandwidth(msgspec.Struct, frozen=True):
    """What one measurement found."""

    all_cores_gbs: float
    """GB/s (10^9 bytes) read by every core at once."""
    one_core_gbs: float
    """GB/s read by one core; never above all_cores_gbs."""
    threads: int
    """Threads used for the all-cores figure."""
    buffer_bytes: int
    """Size of the buffer read."""


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """Size of the largest, highest-level cache sysfs reports, or None."""
    best: tuple[int, int] | None = None
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            raw = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        size = int(raw[:-1]) * _SIZE_UNITS[raw[-1]] if raw[-1] in _SIZE_UNITS else int(raw)
        if best is None or (level, size) > best:
            best = (level, size)
    return best[1] if best else None


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def buffer_size(llc: int | None, available: int, floor: int = 256 * 1024**2) -> int | None:
    """At least 4x the last-level cache (and `floor`), at most a quarter of `available`.

    None when that range is empty: a figure from a buffer that fits in a
    cache would be the cache's speed, not the memory's.
    """
    want = max(4 * (llc or 0), floor)
    if want > available // 4:
        return None
    return want


def measure(passes: int = 5, threads: int | None = None) -> Bandwidth | None:
    """Best of `passes` reads with all threads and with one; None if no honest buffer fits."""
    size = buffer_size(last_level_cache_bytes(), _available_memory())
    if size is None:
        return None
    threads = threads or max_threads() or os.cpu_count() or 1
    buf = Buffer(size)
    buf.read_seconds(threads)  # warm: page tables, frequency
    best_all = min(buf.read_seconds(threads) for _ in range(passes))
    best_one = min(buf.read_seconds(1) for _ in range(passes))
    all_gbs = buf.nbytes / best_all / 1e9
    one_gbs = min(buf.nbytes / best_one / 1e9, all_gbs)
    return Bandwidth(round(all_gbs, 2), round(one_gbs, 2), threads, buf.nbytes)
