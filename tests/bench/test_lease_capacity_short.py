"""The lease benchmark's short phases: a server that fell behind must not look cheaper."""

from __future__ import annotations

import math

from bench.lease_capacity import _Phase, _pooled, _rows
from bench.report import Section


def _paced(acked: int, cpu: float, hosts: int = 100, seconds: float = 10.0) -> _Phase:
    """A paced phase of `hosts` hosts at 1 Hz (1,000 renewals scheduled)."""
    return _Phase(hosts, seconds, [0.001] * acked, cpu, 0, expected=round(hosts * seconds))


def test_a_phase_that_fell_behind_is_flagged_and_left_out_of_the_cpu_figures() -> None:
    """When the cloud falls behind, its hosts renew less often (each waits for its last ack),
    batches grow and CPU per renewal drops: a round with 95 % of its renewals acknowledged
    at 0.5 CPU-s pooled with a full one at 1.0 made 1,000 renewals cost 0.77 s instead of 1.
    The short round is named in the CPU row and left out of the figure and its ratio."""
    full, short = _paced(1000, 1.0), _paced(950, 0.5)
    assert not full.short and short.short
    assert _paced(997, 1.0).short is False
    ours = _pooled([full, short])
    echo = _pooled([_paced(1000, 0.5), _paced(1000, 0.5)])
    assert ours.cpu_per_1000 == 1.0
    assert ours.short == ("round 2: 95.0% acked",)
    assert math.isnan(ours.rounds[1])
    # Rates count every phase: a short one only lowers them.
    assert ours.per_s == 1950 / 20.0
    section = Section("lease_capacity", "Lease capacity", "")
    _rows(section, "SQLite", ours, None, echo, "paced")
    (cpu_row,) = [r for r in section.rows if "CPU-s" in r.metric]
    assert cpu_row.value == 1.0 and cpu_row.ratio == 2.0
    assert "by round x2.00, short" in cpu_row.note
    assert "SHORT, left out: cloud round 2: 95.0% acked" in cpu_row.note


def test_a_closed_loop_phase_has_no_schedule_to_fall_short_of() -> None:
    """Closed-loop hosts renew as fast as they are acknowledged: nothing is expected."""
    loop = _Phase(10, 1.0, [0.001] * 5, 0.2, 0)
    assert not loop.short and _pooled([loop]).cpu_per_1000 == 0.2 / 5 * 1000
