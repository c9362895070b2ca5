"""Measured figures of the fault suite (time to reassign, time to notice a dead link, …).

Tests never assert on these times; they record them so `docs/reliability.md` can quote the last
run. With `AMC_RELIABILITY_FIGURES=<file>` each figure is appended there as one JSON line.
"""

from __future__ import annotations

import json
import os
import time


def record(test: str, name: str, value: float, unit: str = "s") -> None:
    """Print the figure and append it to `$AMC_RELIABILITY_FIGURES` when that is set."""
    line = {"test": test, "figure": name, "value": round(value, 3), "unit": unit, "at": time.time()}
    print(f"[figure] {test}: {name} = {value:.3f} {unit}")
    path = os.environ.get("AMC_RELIABILITY_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
