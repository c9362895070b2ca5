"""The test processes run the cycle collector less often than CPython's default (tests/conftest.py
GC_THRESHOLD): its full collections over a worker's grown heap were a sixth of its CPU."""

from __future__ import annotations

import gc


def test_the_test_process_collects_cycles_less_often_but_still_collects_them() -> None:
    threshold, *_ = gc.get_threshold()
    assert threshold >= 10_000, threshold  # CPython's default is 700
    assert gc.isenabled()
