"""Where a node keeps the CPU constants `llmgw plan calibrate` fitted: `<data_dir>/calibration.json`."""

from __future__ import annotations

from pathlib import Path

import msgspec

from llmgw.proto import CpuCalibration

__all__ = ["CALIBRATION_FILE", "load_calibration", "save_calibration"]

CALIBRATION_FILE = "calibration.json"


def save_calibration(home: Path, fitted: CpuCalibration) -> Path:
    """Keep `fitted` in `home` (written whole, then renamed into place)."""
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{CALIBRATION_FILE}.part"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(fitted)))
    tmp.replace(home / CALIBRATION_FILE)
    return home / CALIBRATION_FILE


def load_calibration(home: Path) -> CpuCalibration | None:
    """This node's calibration, if `llmgw plan calibrate` ran here; a damaged file counts as none."""
    try:
        return msgspec.json.decode((home / CALIBRATION_FILE).read_bytes(), type=CpuCalibration)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
