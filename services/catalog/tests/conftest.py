"""Puts this folder on sys.path, so its tests import the helper modules beside them by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
