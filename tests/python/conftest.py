from __future__ import annotations

import sys
from pathlib import Path

# Helper modules (v4_reference, runner_driver) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))
