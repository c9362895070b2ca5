"""Make `tests.support` importable from here (the repository root is not on sys.path under
pytest's default import mode and there is no root conftest yet)."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
