"""What a replica's engine uses now, measured: its processes' resident memory on the host and,
on cards, the memory NVML says those processes hold (the estimate beside it is the scheduler's)."""

from __future__ import annotations

import contextlib
from types import ModuleType

import psutil

__all__ = ["card_mb_by_pid", "engine_memory_mb", "process_tree"]


def process_tree(pid: int) -> list[psutil.Process]:
    """The engine's process and every process under it (a launcher's engine, vLLM's workers);
    none where it has gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def card_mb_by_pid(nvml: ModuleType | None) -> dict[int, int]:
    """MiB each process holds on this node's cards, summed over the cards (NVML's per-process
    used memory); empty without NVML or a driver. Untested on a real card here: the tests run
    without one (a stand-in NVML covers the reading)."""
    if nvml is None:
        return {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return {}
    held: dict[int, int] = {}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            with contextlib.suppress(nvml.NVMLError):  # a card NVML fails on counts nothing
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    held[p.pid] = held.get(p.pid, 0) + (p.usedGpuMemory or 0) // 2**20
    except nvml.NVMLError:
        pass
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return held


def engine_memory_mb(pid: int, on_cards: dict[int, int]) -> int:
    """MiB the engine with `pid` uses now: its processes' resident sets and what they hold on
    cards (`card_mb_by_pid`); 0 where it has gone."""
    total = 0
    for proc in process_tree(pid):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile counts nothing
            total += proc.memory_info().rss // 2**20 + on_cards.get(proc.pid, 0)
    return total
