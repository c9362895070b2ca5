"""The one phrasing of calls of unknown cost (decision 0080), shared by the operators' console
and CLI (from the wire's usage) and the host's console (from the timeline's)."""

from __future__ import annotations

import pytest

from amc.v1 import types_pb2
from console import formatting
from planner.decision import Usage
from planner.prices import PriceTable
from planner.unsettled import at_most, unsettled_words


def test_both_consoles_say_calls_of_unknown_cost_in_the_same_words() -> None:
    """The host's console had its own copy of the cloud console's words (it may not import
    the operators' console); both now call `planner.unsettled.unsettled_words`."""
    at_most = Usage(input_tokens=12_000, output_tokens=345, cost_usd=0.0123)
    wire = types_pb2.Usage(input_tokens=12_000, output_tokens=345, cost_usd=0.0123)
    assert unsettled_words(1, at_most) == (
        "1 model call whose cost was never recorded: at most 12,345 tokens · $0.0123"
    )
    assert unsettled_words(1_200, at_most).startswith("1,200 model calls whose costs were")
    assert formatting.unsettled_words(types_pb2.UnsettledCalls(calls=2, at_most=wire)) == (
        unsettled_words(2, at_most)
    )


def test_at_most_prices_input_at_the_dearest_rate_a_call_can_be_billed() -> None:
    """`at_most` is an upper bound (a leftover marker and the budget caps count it): with
    Claude's 1-hour cache writes at 2x input, pricing the input at the 5-minute write rate
    (1.25x) understated what the call could cost."""
    price = PriceTable().price("claude-sonnet-4-6")
    assert price is not None and price.cache_write_1h is not None
    most = at_most(system="s" * 1_000, items=[], tools=[], images=0, output_tokens=0, price=price)
    assert most.cost_usd == pytest.approx(most.input_tokens * price.cache_write_1h / 1_000_000)
