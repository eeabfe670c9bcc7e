"""Memory bandwidth of this machine, with all cores and with one.

The figure the scheduler's speed estimate uses: a token on a CPU reads the
weights once, so tokens a second follow from how fast memory reads.
"""

from llmgw.membw._calibration import (
    BANDWIDTH_FILE,
    CALIBRATION_FILE,
    KeptBandwidth,
    load_bandwidth,
    load_calibration,
    save_bandwidth,
    save_calibration,
)
from llmgw.membw._measure import Bandwidth, buffer_size, last_level_cache_bytes, measure

__all__ = [
    "BANDWIDTH_FILE",
    "CALIBRATION_FILE",
    "Bandwidth",
    "KeptBandwidth",
    "buffer_size",
    "last_level_cache_bytes",
    "load_bandwidth",
    "load_calibration",
    "measure",
    "save_bandwidth",
    "save_calibration",
]
