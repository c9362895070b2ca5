"""A share of a CPU for one process (a CFS quota in its own cgroup), to stand in for a machine
per replica on a machine with too few cores.

"Do two replicas hold twice what one holds?" asks for a core per replica, plus cores for the
simulated hosts and the database. On two CPUs the question can still be asked at a smaller
scale: each replica gets the same fraction of CPU 0 (say 40 %) as if it were a small machine of
its own, so one replica uses at most 0.4 of the core and two at most 0.8, and the hosts keep
CPU 1. If two replicas do not reach twice one, something they share (the database, the
hosts) is the limit, which is what the benchmark wants to find.

Needs a writable cgroup `cpu` controller (v1 `cpu.cfs_quota_us` or v2 `cpu.max`), as root in
a container usually has; `available()` says whether this machine has one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000


def _root() -> tuple[Path, bool] | None:
    """(the directory new groups go in, whether it is cgroup v2), if writable."""
    if (_V1 / "cpu.cfs_quota_us").exists() and os.access(_V1, os.W_OK):
        return _V1, False
    controllers = _V2 / "cgroup.controllers"
    if (
        controllers.exists()
        and os.access(_V2, os.W_OK)
        and "cpu" in controllers.read_text().split()
    ):
        return _V2, True
    return None


def available() -> bool:
    """Whether processes can be given a CPU quota here."""
    return _root() is not None


@contextlib.contextmanager
def limited(pid: int, cpus: float, name: str) -> Iterator[None]:
    """Run `pid` (with all its threads) under a quota of `cpus` CPUs until the block ends.

    The group is removed afterwards (the process must have ended or moves back to the root)."""
    found = _root()
    if found is None:
        raise RuntimeError("no writable cgroup cpu controller on this machine")
    root, v2 = found
    group = root / f"amc-bench-{name}-{os.getpid()}"
    group.mkdir(exist_ok=True)
    quota = int(cpus * _PERIOD_US)
    try:
        if v2:
            (group / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            group.rmdir()
