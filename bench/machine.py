"""One line that says what machine the figures come from."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def describe() -> str:
    """nproc, memory, CPU model, kernel, Python version and the date."""
    return (
        f"{os.cpu_count()} CPUs ({_cpu_model()}), {_memory_gib():.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )
