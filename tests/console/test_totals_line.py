"""The console task page's totals line (`present.totals_line`) says which calls' cost is unknown."""

from __future__ import annotations

from amc.v1 import types_pb2
from console.gateway.models import TotalsOut
from console.gateway.present import totals_line


def test_the_totals_line_names_calls_of_unknown_cost_with_their_bound() -> None:
    totals = types_pb2.TaskTotals(steps=2)
    totals.usage.input_tokens = 100
    totals.usage.cost_usd = 0.01
    assert "unknown cost" not in totals_line(TotalsOut.of(totals))
    totals.unsettled.calls = 2
    totals.unsettled.at_most.cost_usd = 0.25
    line = totals_line(TotalsOut.of(totals))
    assert line.endswith(" · 2 calls of unknown cost (at most $0.2500)"), line
