"""The cluster tests drive the load harness of `bench/load.py`; the repository root holds `bench`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
