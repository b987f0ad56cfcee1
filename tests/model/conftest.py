"""Lets the model's tests import their shared cases as ``_cases``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
