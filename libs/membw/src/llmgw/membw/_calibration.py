"""Where a node keeps its own figures: the CPU constants `llmgw plan calibrate` fitted
(`<data_dir>/calibration.json`) and the best memory bandwidth its agent measured
(`<data_dir>/bandwidth.json`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgspec

from llmgw.membw._measure import Bandwidth
from llmgw.proto import CpuCalibration

__all__ = [
    "BANDWIDTH_FILE",
    "CALIBRATION_FILE",
    "KeptBandwidth",
    "load_bandwidth",
    "load_calibration",
    "save_bandwidth",
    "save_calibration",
]

CALIBRATION_FILE = "calibration.json"
BANDWIDTH_FILE = "bandwidth.json"


class KeptBandwidth(msgspec.Struct, frozen=True, kw_only=True):
    """The best memory bandwidth an agent measured here, and when it last measured."""

    best: Bandwidth
    best_at: float
    """Unix time of the best figure's measurement."""
    measured_at: float
    """Unix time of the last measurement."""
    machine: str
    """The machine measured, as its agent names it (host, CPUs, memory): a data directory copied
    to another, or a machine resized, measures again."""


def _save(home: Path, name: str, value: msgspec.Struct) -> Path:
    """Keep `value` in `home/name` (written whole under a name of its own, then renamed into
    place: two writers never share a half-written file)."""
    home.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=home)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.format(msgspec.json.encode(value)))
        os.replace(tmp, home / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return home / name


def save_calibration(home: Path, fitted: CpuCalibration) -> Path:
    """Keep `fitted` in `home`."""
    return _save(home, CALIBRATION_FILE, fitted)


def save_bandwidth(home: Path, kept: KeptBandwidth) -> Path:
    """Keep the agent's best figure in `home`: an agent started again (an upgrade, a crash) reports
    it at once, without reading all memory on every core while its engines serve."""
    return _save(home, BANDWIDTH_FILE, kept)


def load_bandwidth(home: Path, machine: str) -> KeptBandwidth | None:
    """The best figure an agent kept here, if of `machine`; a damaged file counts as none."""
    try:
        kept = msgspec.json.decode((home / BANDWIDTH_FILE).read_bytes(), type=KeptBandwidth)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return kept if kept.machine == machine else None


def load_calibration(home: Path) -> CpuCalibration | None:
    """This node's calibration, if `llmgw plan calibrate` ran here; a damaged file counts as none."""
    try:
        return msgspec.json.decode((home / CALIBRATION_FILE).read_bytes(), type=CpuCalibration)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
