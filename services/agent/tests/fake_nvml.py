"""FakeNvml: a stand-in for the `pynvml` module (nvidia-ml-py), named so.

It answers the calls `llmgw.agent.discovery` makes, from a list of fake cards, so discovery is
tested on one card, eight, MIG, NVLink, no driver and a driver error without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    """As pynvml.NVMLError."""


@dataclass
class FakeCard:
    name: str = "NVIDIA H100 80GB HBM3"
    total_mb: int = 81559
    used_mb: int = 0
    capability: tuple[int, int] = (9, 0)
    processes: list[tuple[int, int]] = field(default_factory=list)
    """(pid, MiB)"""
    mig: list[tuple[str, int]] | None = None
    """MIG instances (name, MiB) when the card is carved into MIG."""
    nvlink_to: list[int] = field(default_factory=list)
    """Indices of the cards it is linked to."""
    broken: bool = False
    """NVML fails on it (a driver error)."""


class FakeNvml:
    """The subset of pynvml the agent uses."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, cards: list[FakeCard], driver: str | None = "570.124.06") -> None:
        self.cards, self.driver = cards, driver
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.driver is None:
            raise NVMLError("Driver Not Loaded")
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("card", i)

    def _card(self, handle):
        card = self.cards[handle[1]]
        if card.broken:
            raise NVMLError("Unknown Error")
        return card

    def nvmlDeviceGetName(self, handle):
        if handle[0] == "mig":
            return self._card(handle).mig[handle[2]][0]
        return self._card(handle).name

    def nvmlDeviceGetUUID(self, handle):
        if handle[0] == "mig":
            return f"MIG-{handle[1]}-{handle[2]}"
        return f"GPU-{handle[1]:04d}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        card = self._card(handle)
        if handle[0] == "mig":
            return SimpleNamespace(total=card.mig[handle[2]][1] * 2**20, used=0)
        return SimpleNamespace(total=card.total_mb * 2**20, used=card.used_mb * 2**20)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._card(handle).capability

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if handle[0] == "mig":
            return []
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb * 2**20) for pid, mb in self._card(handle).processes]

    def nvmlDeviceGetMigMode(self, handle):
        card = self._card(handle)
        if card.capability < (8, 0):
            raise NVMLError("Not Supported")
        return (1 if card.mig is not None else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, j):
        if j >= len(self._card(handle).mig):
            raise NVMLError("Not Found")
        return ("mig", handle[1], j)

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=f"00000000:{handle[1] + 0x10:02X}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, handle, link):
        card = self._card(handle)
        if not card.nvlink_to:
            raise NVMLError("Not Supported")
        return 1 if link < len(card.nvlink_to) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        return self.nvmlDeviceGetPciInfo(("card", self._card(handle).nvlink_to[link]))
