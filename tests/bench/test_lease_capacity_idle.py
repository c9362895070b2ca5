"""The lease benchmark's idle windows: what a replica spends per second whatever its renewals."""

from __future__ import annotations

import pytest

from bench.lease_capacity import Idle, _idle_rows
from bench.report import Section


def test_the_idle_excess_is_stated_per_paced_renewal() -> None:
    """A replica at 1.6 % of a core beside an echo at 0.1 %, with 2,000 hosts renewing once a
    second when paced: the 1.5 % of a core it spends anyway is 7.5 us of each paced renewal's
    CPU, the share of the paced ratio that renewals do not cause."""
    section = Section("lease_capacity", "Lease capacity", "")
    _idle_rows(section, "SQLite", Idle(ours=(0.015, 0.017), echo=(0.001, 0.001)), 2000)
    share, per_renewal = section.rows
    assert share.value == 1.6 and share.baseline == 0.1
    assert "by round 1.50 vs 0.10, 1.70 vs 0.10" in share.note
    assert per_renewal.unit == "us"
    assert per_renewal.value == pytest.approx(7.5)
