"""The CLI tests use the shared live service (``live``, tests/live_plugin.py) and the
client tests' input builders (tests/client)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
