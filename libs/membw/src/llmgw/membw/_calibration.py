"""Where a node keeps its own figures: the CPU constants `llmgw plan calibrate` fitted
(`<data_dir>/calibration.json`) and the best memory bandwidth its agent measured
(`<data_dir>/bandwidth.json`)."""

from __future__ import annotations

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
    measured_at: float
    """Unix time of the last measurement (not necessarily the best one's)."""


def _save(home: Path, name: str, value: msgspec.Struct) -> Path:
    """Keep `value` in `home/name` (written whole, then renamed into place)."""
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{name}.part"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(value)))
    tmp.replace(home / name)
    return home / name


def save_calibration(home: Path, fitted: CpuCalibration) -> Path:
    """Keep `fitted` in `home`."""
    return _save(home, CALIBRATION_FILE, fitted)


def save_bandwidth(home: Path, kept: KeptBandwidth) -> Path:
    """Keep the agent's best figure in `home`: an agent started again (an upgrade, a crash) reports
    it at once, without reading all memory on every core while its engines serve."""
    return _save(home, BANDWIDTH_FILE, kept)


def load_bandwidth(home: Path) -> KeptBandwidth | None:
    """The best figure an agent kept here; a damaged file counts as none."""
    try:
        return msgspec.json.decode((home / BANDWIDTH_FILE).read_bytes(), type=KeptBandwidth)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def load_calibration(home: Path) -> CpuCalibration | None:
    """This node's calibration, if `llmgw plan calibrate` ran here; a damaged file counts as none."""
    try:
        return msgspec.json.decode((home / CALIBRATION_FILE).read_bytes(), type=CpuCalibration)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
