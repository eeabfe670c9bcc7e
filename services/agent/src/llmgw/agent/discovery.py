"""What this node is: its cards (through NVML), CPUs, memory, OS, filesystems and engines.

NVML is passed in (the `pynvml` module from nvidia-ml-py, or a stand-in in tests), so every
path — one card, many, MIG, NVLink, no driver, a driver error — is tested without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import msgspec

from llmgw.modelplan import card_class
from llmgw.proto import Filesystem, GpuInfo

__all__ = ["Cards", "EngineProbe", "cpu_flags", "discover_cards", "filesystems", "load_nvml", "os_release"]

_CPU_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)
"""The CPU features that decide which llama.cpp kernels run."""


class Cards(msgspec.Struct, kw_only=True):
    """What NVML said: the cards, the driver, and what went wrong (said once by the caller)."""

    gpus: list[GpuInfo] = msgspec.field(default_factory=list)
    driver: str = ""
    problems: list[str] = msgspec.field(default_factory=list)


def load_nvml() -> ModuleType | None:
    """The pynvml module, or None where nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mb(n: int | None) -> int:
    return (n or 0) // 2**20


def _foreign_mb(nvml: ModuleType, handle, used_mb: int, own_pids: set[int]) -> int:
    """Memory held by processes that are not ours; all of it where NVML cannot list them."""
    try:
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError:
        return used_mb
    return sum(_mb(p.usedGpuMemory) for p in procs if p.pid not in own_pids)


def _card(nvml: ModuleType, index: int, handle, own_pids: set[int], parent: str = "") -> GpuInfo:
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability = f"{major}.{minor}"
    except nvml.NVMLError:
        capability = ""
    used = _mb(memory.used)
    return GpuInfo(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=name,
        cls=card_class(name, _mb(memory.total)),
        memory_total_mb=_mb(memory.total),
        memory_used_mb=used,
        memory_foreign_mb=_foreign_mb(nvml, handle, used, own_pids),
        compute_capability=capability,
        mig_parent=parent,
    )


def _mig_instances(nvml: ModuleType, index: int, handle, own_pids: set[int], parent: str) -> list[GpuInfo] | None:
    """The MIG instances of a card carved into MIG, or None for a card that is not."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return None  # not MIG-capable
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    out = []
    for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            out.append(_card(nvml, index, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j), own_pids, parent))
        except nvml.NVMLError:
            continue  # an empty slot
    return out


def _nvlink_buses(nvml: ModuleType, handle) -> list[str]:
    buses = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                buses.append(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower())
        except nvml.NVMLError:
            break  # no (more) links
    return buses


def discover_cards(nvml: ModuleType | None, own_pids: set[int] = frozenset()) -> Cards:
    """Every card, or the MIG instances of a card carved into MIG; a card NVML fails on is left
    out and said in `problems`. No driver is a node without cards, said once in `problems`."""
    if nvml is None:
        return Cards(problems=["nvidia-ml-py is not installed: a node without GPUs"])
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return Cards(problems=[f"no NVIDIA driver ({exc}): a node without GPUs"])
    cards = Cards()
    try:
        cards.driver = _text(nvml.nvmlSystemGetDriverVersion())
        bus_of: dict[str, str] = {}
        links: dict[str, list[str]] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                whole = _card(nvml, i, handle, own_pids)
                bus_of[_text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower()] = whole.uuid
                links[whole.uuid] = _nvlink_buses(nvml, handle)
                instances = _mig_instances(nvml, i, handle, own_pids, whole.uuid)
                cards.gpus.extend(instances if instances is not None else [whole])
            except nvml.NVMLError as exc:
                cards.problems.append(f"card {i}: NVML failed ({exc}); left out")
        for gpu in cards.gpus:
            if not gpu.mig_parent:
                gpu.nvlink_peers = sorted({bus_of[b] for b in links.get(gpu.uuid, []) if b in bus_of} - {gpu.uuid})
    except nvml.NVMLError as exc:
        cards.problems.append(f"NVML failed ({exc}); cards left out")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return cards


def cpu_flags(cpuinfo: str) -> list[str]:
    """The CPU features engines care about, from the text of /proc/cpuinfo (x86 'flags', Arm 'Features')."""
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    have = set(m.group(1).split()) if m else set()
    return [f for f in _CPU_FLAGS if f in have]


def os_release(text: str) -> str:
    """'<id> <version> (<codename>)' from the text of /etc/os-release."""
    fields = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            fields[key.strip()] = value.strip().strip('"')
    out = " ".join(x for x in (fields.get("ID", ""), fields.get("VERSION_ID", "")) if x)
    codename = fields.get("VERSION_CODENAME")
    return f"{out} ({codename})" if codename else out


def filesystems(paths: list[Path]) -> list[Filesystem]:
    """Size and free space of each filesystem weights are kept on (each reported once)."""
    out, seen = [], set()
    for path in paths:
        try:
            dev = os.stat(path).st_dev
            usage = shutil.disk_usage(path)
        except OSError:
            continue
        if dev not in seen:
            seen.add(dev)
            out.append(Filesystem(path=str(path), total_mb=usage.total // 2**20, free_mb=usage.free // 2**20))
    return out


class EngineProbe:
    """Engines installed here and their versions, probed again when a binary changes."""

    def __init__(self, binaries: dict[str, str]) -> None:
        self.binaries = binaries
        self._seen: dict[str, tuple[float, str]] = {}

    def versions(self) -> dict[str, str]:
        """Engine -> version, for each binary that exists and answers `--version`."""
        out = {}
        for engine, binary in self.binaries.items():
            path = shutil.which(binary) if binary else None
            if not path:
                continue
            mtime = os.stat(path).st_mtime
            known = self._seen.get(engine)
            if known is None or known[0] != mtime:
                self._seen[engine] = (mtime, _version_of(path))
            out[engine] = self._seen[engine][1]
        return out


def _version_of(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (done.stdout + "\n" + done.stderr).strip()
    m = re.search(r"version:?\s*(\S+(?:\s+\([0-9a-f]+\))?)", text) or re.search(r"\b(\d+\.\d+[\w.+-]*)\b", text)
    return m.group(1) if m else (text.splitlines()[0] if text else "unknown")
