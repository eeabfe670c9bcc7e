"""Memory bandwidth of this machine, with all cores and with one.

The figure the scheduler's speed estimate uses: a token on a CPU reads the
weights once, so tokens a second follow from how fast memory reads.
"""

from llmgw.membw._calibration import CALIBRATION_FILE, load_calibration, save_calibration
from llmgw.membw._measure import Bandwidth, buffer_size, last_level_cache_bytes, measure

__all__ = [
    "CALIBRATION_FILE",
    "Bandwidth",
    "buffer_size",
    "last_level_cache_bytes",
    "load_calibration",
    "measure",
    "save_calibration",
]
